"""Opening SQLite stores: read-only, errors that name the path, the busy budget, schema versions."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runifold import RunStatus, StoreError, WorkflowTask, open_store
from runifold.errors import StoreUnavailableError
from runifold.stores import _sql
from runifold.stores.sqlite import SCHEMA_VERSION, SqliteWorkflowStore
from tests.support import read_only_file


async def _make(path: Path) -> str:
    store = await SqliteWorkflowStore.open(str(path))
    try:
        return (await store.enqueue(WorkflowTask("wf", 1, {}, checkpoint_id="c1"))).run_id
    finally:
        await store.close()


async def test_read_only_open_reads_without_writing(tmp_path: Path) -> None:
    """readonly=True reads runs, history and audit, refuses writes, and leaves the schema as it was."""
    path = tmp_path / "runifold.db"
    run_id = await _make(path)
    store = await SqliteWorkflowStore.open(str(path), readonly=True)
    try:
        assert [r.run_id for r in await store.list_runs()] == [run_id]
        assert (await store.get_run("c1")).status is RunStatus.READY
        assert [e.type for e in await store.history(run_id)] == ["run_started"]
        assert await store.audit("c1") == [] and await store.count_runs() == 1
        assert await store.migrate() == SCHEMA_VERSION
        with pytest.raises(StoreError, match="read-only"):
            await store.enqueue(WorkflowTask("wf", 1, {}))
    finally:
        await store.close()


async def test_read_only_open_of_a_missing_file_names_it_and_creates_nothing(tmp_path: Path) -> None:
    """A read-only open of a path with no database says which path, and creates no file there."""
    missing = tmp_path / "elsewhere" / "runifold.db"
    for opening in (SqliteWorkflowStore.open(str(missing), readonly=True),
                    open_store(f"sqlite:///{tmp_path / 'runifold.db'}?mode=ro")):
        with pytest.raises(StoreUnavailableError) as err:
            await opening
        assert str(tmp_path) in str(err.value)
    assert list(tmp_path.iterdir()) == []


async def test_read_only_url_opens_read_only(tmp_path: Path) -> None:
    """sqlite:///path?mode=ro opens the store read-only."""
    path = tmp_path / "runifold.db"
    run_id = await _make(path)
    store = await open_store(f"sqlite:///{path}?mode=ro")
    try:
        assert [r.run_id for r in await store.list_runs()] == [run_id]
        with pytest.raises(StoreError, match="read-only"):
            await store.purge_finished(time.time())
    finally:
        await store.close()


async def test_an_open_error_names_the_path(tmp_path: Path) -> None:
    """A database that cannot be created (its folder is missing) gives an error naming the path, and that the
    folder is what is missing (it said to check that the path exists, or to open it read-only: helper-42)."""
    path = tmp_path / "no-such-folder" / "runifold.db"
    with pytest.raises(StoreUnavailableError) as err:
        await SqliteWorkflowStore.open(str(path))
    assert str(path) in str(err.value)
    assert f"the directory {path.parent} does not exist" in str(err.value) and "read-only" not in str(err.value)

    # a file that is not a database: said so, writable or read-only (it said to check that the path is writable:
    # helper-54; read-only it gave SQLite's words alone: helper-98)
    other = tmp_path / "notes.db"
    other.write_text("not a database, but a file of notes that happens to end in .db\n" * 100)
    for readonly in (False, True):
        with pytest.raises(StoreError) as err:
            await SqliteWorkflowStore.open(str(other), readonly=readonly)
        assert "notes.db is not a SQLite database, or is damaged (SQLITE_NOTADB: file is not a database); check the " \
               "path, or restore the file from a backup" in str(err.value)
    # a folder given as the database, and a database of another application's (helper-98: "table runs already
    # exists"; read-only, "open it writable to create it", which a folder never is)
    for readonly in (False, True):
        with pytest.raises(StoreUnavailableError, match="it is a directory; give the path of a file in it"):
            await SqliteWorkflowStore.open(str(tmp_path), readonly=readonly)
    theirs = tmp_path / "app.db"
    with sqlite3.connect(theirs) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreError, match=r"holds tables of another application \(table runs already exists\), which "
                                         "runifold's schema cannot share: give runifold a database file of its own"):
        await SqliteWorkflowStore.open(str(theirs))


def test_a_full_or_failing_disk_says_so_and_what_to_do() -> None:
    """helper-98: a full disk said "check that the path exists and is writable, or open it read-only", and on a
    write "database or disk is full" alone."""
    from runifold.stores._sqlite_errors import translate

    class Full(sqlite3.OperationalError):
        sqlite_errorname = "SQLITE_FULL"

    class ShmSize(sqlite3.OperationalError):
        sqlite_errorname = "SQLITE_IOERR_SHMSIZE"

    for exc in (Full("database or disk is full"), ShmSize("disk I/O error")):
        said = translate(exc, "/srv/runifold.db")
        assert isinstance(said, StoreUnavailableError)
        assert "the disk is full or failing; free space (keep room for the write-ahead log /srv/runifold.db-wal " \
               "beside it, several MB) or check the disk" in str(said)


@pytest.fixture
def read_only_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder on a file system mounted read-only (needs root, as in CI)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a file system needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


async def test_read_only_commands_work_on_a_read_only_file_system(read_only_folder: Path) -> None:
    """On a read-only file system a read-only open lists runs; a writable open fails naming the path."""
    path = read_only_folder / "runifold.db"
    run_id = await _make(path)
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_folder)], check=True)
    store = await SqliteWorkflowStore.open(str(path), readonly=True)
    try:
        assert [r.run_id for r in await store.list_runs()] == [run_id]
        assert [e.type for e in await store.history("c1")] == ["run_started"]
    finally:
        await store.close()
    with pytest.raises(StoreUnavailableError) as err:
        await SqliteWorkflowStore.open(str(path))
    assert str(path) in str(err.value)


async def test_a_file_that_cannot_be_written_is_refused_at_a_writable_open(tmp_path: Path) -> None:
    """A writable open of a database file this process cannot write fails naming the file and what to do (it
    opened, and a worker on it logged slot_error at every claim until stopped); a read-only open still reads it."""
    path = tmp_path / "runifold.db"
    run_id = await _make(path)
    with read_only_file(path):
        for url in (str(path), f"sqlite:///{path}"):
            with pytest.raises(StoreUnavailableError) as err:
                await open_store(url)
            assert str(path) in str(err.value) and "SQLITE_READONLY" in str(err.value)
            assert "writable" in str(err.value) and "?mode=ro" in str(err.value)
        store = await SqliteWorkflowStore.open(str(path), readonly=True)
        try:
            assert [r.run_id for r in await store.list_runs()] == [run_id]
        finally:
            await store.close()


async def test_the_busy_budget_is_the_one_configured(tmp_path: Path) -> None:
    """With another process holding the write lock, each write gives up after about busy_seconds, not a multiple."""
    path = tmp_path / "runifold.db"
    await _make(path)
    store = await SqliteWorkflowStore.open(str(path), busy_seconds=0.2)
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        results = await asyncio.gather(*(store.enqueue(WorkflowTask("wf", 1, {"i": i})) for i in range(4)),
                                       return_exceptions=True)
        waited = time.monotonic() - started
        assert all(isinstance(r, StoreUnavailableError) and str(path) in str(r) for r in results), results
        # the bug this guards against waited 25 s per write; the budget is 0.2 s (generous bound for a loaded machine)
        assert waited < 5, waited
        other.execute("COMMIT")
        assert (await store.enqueue(WorkflowTask("wf", 1, {"i": 9}))).created
    finally:
        other.close()
        await store.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database migrated by a newer runifold is refused with a clear error, writable or read-only."""
    path = tmp_path / "runifold.db"
    await _make(path)
    conn = sqlite3.connect(str(path))
    conn.execute("INSERT INTO runifold_schema (version, applied_at) VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    for readonly in (False, True):
        with pytest.raises(StoreError, match=f"version {SCHEMA_VERSION + 1}, newer"):
            await SqliteWorkflowStore.open(str(path), readonly=readonly)


async def test_a_later_migration_applies_on_top_of_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database created from the baseline is recognised, and a later migration is applied to it once."""
    path = tmp_path / "runifold.db"
    run_id = await _make(path)
    later = [*_sql.migrations("sqlite"), (SCHEMA_VERSION + 1, "CREATE TABLE later_feature (x INTEGER);")]
    monkeypatch.setattr("runifold.stores.sqlite.migrations", lambda dialect: later)
    monkeypatch.setattr("runifold.stores.sqlite.SCHEMA_VERSION", SCHEMA_VERSION + 1)
    for _ in range(2):
        store = await SqliteWorkflowStore.open(str(path))
        try:
            assert await store.migrate() == SCHEMA_VERSION + 1
            assert (await store.get_run(run_id)).checkpoint_id == "c1"
        finally:
            await store.close()
    conn = sqlite3.connect(str(path))
    versions = [v for (v,) in conn.execute("SELECT version FROM runifold_schema ORDER BY version")]
    conn.close()
    assert versions == [1, SCHEMA_VERSION + 1]


async def test_a_mistyped_store_url_is_refused_saying_which_forms_there_are(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`sqllite:///a.db` and `sqlite:/b.db` were opened as files of those names, and `sqlite://my.db` as a relative
    path, all created where the command ran (helper-18)."""
    from runifold.errors import ConfigurationError

    monkeypatch.chdir(tmp_path)
    for url in ("sqllite:///a.db", "sqlite:/b.db", "postgress://u@h/db"):
        with pytest.raises(ConfigurationError, match=r"unrecognised store URL .* use sqlite:///relative.db, "
                                                     r"sqlite:////abs/path.db, a path ending in .db, .sqlite or .sqlite3, "
                                                     r"postgresql://user@host/db or memory:"):
            await open_store(url)
    with pytest.raises(ConfigurationError, match=r"a SQLite URL takes three slashes .* sqlite:///my.db or"):
        await open_store("sqlite://my.db")
    with pytest.raises(ConfigurationError, match=r"the SQLite URL 'sqlite:///' names no file"):
        await open_store("sqlite:///")
    # a PostgreSQL URL whose port or host cannot be read was a ValueError or OverflowError (exit 3, "a bug");
    # the message never repeats the URL, which may hold a password (helper-23)
    for url, why in (("postgresql://u:pw@127.0.0.1:99999/db", "Port out of range 0-65535"),
                     ("postgresql://u:pw@127.0.0.1:abc/db", "Port could not be cast to integer value as 'abc'"),
                     ("postgresql://u:pw@[::1/db", "Invalid IPv6 URL")):
        with pytest.raises(ConfigurationError) as refused:
            await open_store(url)
        assert str(refused.value) == f"unrecognised PostgreSQL URL ({why}); use postgresql://user@host:port/db"
    # SQLite's read-only switch reached the server as an unknown setting (helper-63)
    with pytest.raises(ConfigurationError, match=r"\?mode=ro is a SQLite URL's: .* drop \?mode="):
        await open_store("postgresql://u@127.0.0.1:1/db?mode=ro")
    assert list(tmp_path.iterdir()) == []
    store = await open_store("plain.db")  # a plain path ending in .db is a SQLite file, as documented
    await store.close()
    assert (tmp_path / "plain.db").exists()


async def test_open_store_with_create_false_opens_only_a_store_that_exists(tmp_path: Path) -> None:
    """``open_store(url, create=False)`` refuses a missing file, naming it, and creates none; an existing store opens."""
    missing = tmp_path / "typo.db"
    with pytest.raises(StoreError, match=f"no SQLite store at {missing}.*runifold migrate"):
        await open_store(f"sqlite:///{missing}", create=False)
    assert not missing.exists()
    await _make(tmp_path / "there.db")
    store = await open_store(f"sqlite:///{tmp_path / 'there.db'}", create=False)
    try:
        assert await store.count_runs() == 1
    finally:
        await store.close()
