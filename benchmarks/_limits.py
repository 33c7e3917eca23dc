"""The raw limits: what the database itself does, measured in the same run as runifold."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiosqlite
import asyncpg  # type: ignore[import-untyped]

OPS = 2000


@dataclass
class Limits:
    """Durable single-row insert+commit operations per second."""

    one: float  # one connection (SQLite: stdlib sqlite3 in the calling thread)
    many: float  # 8 connections at once
    extra: dict[str, float] = field(default_factory=dict)
    #: the process's CPU seconds per operation, for the one-connection limits
    cpu: dict[str, float] = field(default_factory=dict)
    #: the 8-connection limit's machine-wide CPU (client and server): seconds per operation,
    #: and the share of all cores busy while it ran (PostgreSQL; 0 where not measured)
    many_machine: float = 0.0
    many_busy: float = 0.0

    def averaged(self, other: Limits) -> Limits:
        """The mean of two measurements (taken just before and just after a workload)."""

        def mean(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
            return {k: (v + b[k]) / 2 for k, v in a.items() if k in b}

        return Limits((self.one + other.one) / 2, (self.many + other.many) / 2,
                      mean(self.extra, other.extra), mean(self.cpu, other.cpu),
                      (self.many_machine + other.many_machine) / 2, (self.many_busy + other.many_busy) / 2)

    def describe(self) -> list[str]:
        lines = [f"1 connection {self.one:,.0f} commits/s", f"8 connections {self.many:,.0f} commits/s"]
        lines += [f"{k} {v:,.0f} commits/s" for k, v in self.extra.items()]
        lines += [f"{k}: {v * 1000:.3f} ms CPU per commit" for k, v in self.cpu.items()]
        return lines


def machine_busy() -> float:
    """CPU seconds all cores of this machine have spent busy since boot (Linux ``/proc/stat``).

    User, nice, system, irq and softirq time; not idle, iowait, or the time the
    hypervisor gave to other machines (steal).
    """
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _sqlite_conn(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _sqlite_inserts(conn: sqlite3.Connection, n: int) -> None:
    for _ in range(n):
        conn.execute("INSERT INTO t (body) VALUES (?)", ('{"type":"step_completed","output":{"i":1}}',))


async def _sqlite() -> Limits:
    folder = tempfile.mkdtemp(prefix="runifold-bench-")
    path = str(Path(folder) / "raw.db")
    conn = _sqlite_conn(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    started, cpu = time.perf_counter(), time.process_time()
    _sqlite_inserts(conn, OPS)
    one, one_cpu = OPS / (time.perf_counter() - started), (time.process_time() - cpu) / OPS
    conns = [_sqlite_conn(path) for _ in range(8)]
    threads = [threading.Thread(target=_sqlite_inserts, args=(c, OPS // 8)) for c in conns]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    many = (OPS // 8 * 8) / (time.perf_counter() - started)
    async with aiosqlite.connect(path, isolation_level=None) as aconn:
        await aconn.execute("PRAGMA synchronous=FULL")
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(OPS // 2):
            await aconn.execute("INSERT INTO t (body) VALUES (?)", ("x",))
        through_aiosqlite = (OPS // 2) / (time.perf_counter() - started)
        aiosqlite_cpu = (time.process_time() - cpu) / (OPS // 2)
    for c in [conn, *conns]:
        c.close()
    os.remove(path)
    return Limits(one, many, {"1 connection through aiosqlite": through_aiosqlite},
                  {"in-thread sqlite3": one_cpu, "through aiosqlite": aiosqlite_cpu})


async def _postgres(dsn: str) -> Limits:
    setup = await asyncpg.connect(dsn)
    await setup.execute("DROP TABLE IF EXISTS bench_raw; CREATE TABLE bench_raw (id bigserial PRIMARY KEY, body jsonb)")
    body = '{"type":"step_completed","output":{"i":1}}'

    async def inserts(conn: asyncpg.Connection, n: int) -> None:
        for _ in range(n):
            await conn.execute("INSERT INTO bench_raw (body) VALUES ($1::jsonb)", body)

    started, cpu = time.perf_counter(), time.process_time()
    await inserts(setup, OPS)
    one, one_cpu = OPS / (time.perf_counter() - started), (time.process_time() - cpu) / OPS
    conns = [await asyncpg.connect(dsn) for _ in range(8)]
    started, busy = time.perf_counter(), machine_busy()
    await asyncio.gather(*[inserts(c, OPS // 8) for c in conns])
    wall, busy = time.perf_counter() - started, machine_busy() - busy
    many = (OPS // 8 * 8) / wall
    for c in conns:
        await c.close()
    await setup.execute("DROP TABLE bench_raw")
    await setup.close()
    return Limits(one, many, cpu={"1 asyncpg connection (client)": one_cpu},
                  many_machine=busy / (OPS // 8 * 8), many_busy=busy / wall / (os.cpu_count() or 1))


async def measure(kind: str) -> Limits:
    if kind == "sqlite":
        return await _sqlite()
    return await _postgres(os.environ["RUNIFOLD_TEST_POSTGRES"])
