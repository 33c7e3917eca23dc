"""The recovery drill, run against a real store with real worker processes.

1. enqueue a task with a known checkpoint id;
2. SIGKILL the worker while a deterministic step is in flight;
3. wait beyond the lease and start a worker with another identity;
4. check completed steps were not repeated and usage never decreased;
5. repeat at an effect: evidence *applied* makes it replayed, evidence
   *unknown* makes it ambiguous, never a guess from a timeout;
6. deploy version 2 while a version 1 run waits on a timer: both stay
   registered, the v1 run finishes on v1 code, a new run uses v2.

The drill only touches runs whose checkpoint ids it made, and purges them at the end.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runifold.drill._app import registry_v2
from runifold.history import Entry, Usage, decode_event, fold
from runifold.stores import RunStatus, WorkflowStore, WorkflowTask, open_store
from runifold.worker import cancel_run

LEASE = 1.0


@dataclass
class DrillStep:
    """One line of the drill's report."""

    number: str
    title: str
    passed: bool = False
    evidence: list[str] = field(default_factory=list)


@dataclass
class DrillReport:
    steps: list[DrillStep] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(s.passed for s in self.steps)


class _Drill:
    def __init__(self, url: str, store: WorkflowStore, folder: Path, report: DrillReport,
                 on_step: Callable[[DrillStep], None]) -> None:
        self.url = url
        self.store = store
        self.dir = folder
        self.report = report
        self.on_step = on_step
        self.nonce = secrets.token_hex(4)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.checkpoints: list[str] = []

    def checkpoint(self, what: str) -> str:
        cid = f"drill-{self.nonce}-{what}"
        self.checkpoints.append(cid)
        return cid

    def spawn(self, worker_id: str, app: str = "registry") -> subprocess.Popen[bytes]:
        env = {**os.environ, "RUNIFOLD_DRILL_DIR": str(self.dir)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "runifold.cli", "--store", self.url, "--app", f"runifold.drill._app:{app}",
             "worker", "--lease", str(LEASE), "--worker-id", f"{worker_id}-{self.nonce}", "--concurrency", "4",
             "--idle-wait", "0.1", "--grace", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    async def wait_for(self, condition: Callable[[], bool] | Callable[[], object], what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def status_is(self, ref: str, *statuses: RunStatus) -> bool:
        return (await self.store.get_run(ref)).status in statuses

    async def entries(self, ref: str) -> list[Entry]:
        return [Entry(e.seq, e.at, decode_event(e.body)) for e in await self.store.history(ref)]

    def counts(self, checkpoint: str) -> Counter[str]:
        path = self.dir / "counts"
        lines = path.read_text().splitlines() if path.exists() else []
        return Counter(name for cid, name in (line.split() for line in lines) if cid == checkpoint)

    def begin(self, number: str, title: str) -> DrillStep:
        step = DrillStep(number, title)
        self.report.steps.append(step)
        return step

    def end(self, step: DrillStep, passed: bool, *evidence: str) -> None:
        step.passed = passed
        step.evidence.extend(evidence)
        self.on_step(step)

    async def kill_in_flight(self, cid: str, workflow: str) -> tuple[subprocess.Popen[bytes], Usage]:
        """Run ``cid`` on a worker and SIGKILL it while its step is in flight; return it and the usage then.

        No other drill worker may run meanwhile, or it could claim ``cid`` first.
        """
        (self.dir / f"block-{cid}").touch()
        await self.store.enqueue(WorkflowTask(workflow, 1, {"checkpoint": cid}, checkpoint_id=cid))
        doomed = self.spawn("drill-a")
        await self.wait_for(lambda: (self.dir / f"in-flight-{cid}").exists(), f"{cid} in flight")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        usage = fold(await self.entries(cid)).usage
        (self.dir / f"block-{cid}").unlink()
        return doomed, usage

    async def run(self) -> None:
        cid = self.checkpoint("steps")
        s1 = self.begin("1", "enqueue a task with a known checkpoint id")
        result = await self.store.enqueue(WorkflowTask("runifold-drill-steps", 1, {"checkpoint": cid}, checkpoint_id=cid))
        again = await self.store.enqueue(WorkflowTask("runifold-drill-steps", 1, {"checkpoint": cid}, checkpoint_id=cid))
        self.end(s1, result.created and again.run_id == result.run_id and not again.created,
                 f"checkpoint id {cid} -> run {result.run_id}; enqueued again -> same run, created={again.created}")

        s2 = self.begin("2", "SIGKILL the worker while a deterministic step is in flight")
        doomed, before = await self.kill_in_flight(cid, "runifold-drill-steps")
        info = await self.store.get_run(cid)
        self.end(s2, doomed.returncode == -signal.SIGKILL and info.status is RunStatus.RUNNING,
                 f"worker pid {doomed.pid} killed (exit {doomed.returncode}) during drill_in_flight#1; "
                 f"run left {info.status} with lease of {info.lease_owner} until expiry; usage then: steps {before.steps}")

        s3 = self.begin("3", "wait beyond the lease, start a worker with another identity")
        lease_until = info.lease_until or 0.0
        await self.wait_for(lambda: self._past(lease_until), "lease expiry", timeout=LEASE + 10)
        rescuer = self.spawn("drill-b")
        await self.wait_for(lambda: self.status_is(cid, RunStatus.COMPLETED), "the rescued run to complete")
        after_info = await self.store.get_run(cid)
        self.stop(rescuer)
        self.end(s3, after_info.status is RunStatus.COMPLETED,
                 f"lease expired; drill-b-{self.nonce} claimed with token {after_info.lease_token} > {info.lease_token} "
                 f"and completed the run at revision {after_info.revision}")

        s4 = self.begin("4", "completed steps not repeated, usage never decreased")
        entries = await self.entries(cid)
        after = fold(entries)
        counts = self.counts(cid)
        keys = [e.event.key for e in entries if e.event.key]
        ok = (counts == Counter(prepare=1, in_flight=2, finish=1) and keys == ["drill_prepare#1", "drill_in_flight#1", "drill_finish#1"]
              and after.usage.steps >= before.steps)
        self.end(s4, ok, f"body executions: prepare {counts['prepare']}, in_flight {counts['in_flight']} "
                 f"(killed once, run again), finish {counts['finish']}; each key committed once: {keys}",
                 f"usage steps {before.steps} at the crash -> {after.usage.steps} after recovery")

        s5 = self.begin("5", "at an effect: evidence decides replayed or ambiguous, never a timeout")
        applied = self.checkpoint("effect-applied")
        await self.kill_in_flight(applied, "runifold-drill-effect")
        rescuer = self.spawn("drill-b")
        await self.wait_for(lambda: self.status_is(applied, RunStatus.COMPLETED), "the effect run to complete")
        self.stop(rescuer)
        types = [e.type for e in await self.store.history(applied)]
        with_evidence = "effect_reconciled" in types and "effect_completed" not in types and self.counts(applied)["write"] == 1
        unknown = self.checkpoint("effect-unknown")
        (self.dir / f"evidence-down-{unknown}").touch()
        await self.kill_in_flight(unknown, "runifold-drill-effect")
        rescuer = self.spawn("drill-b")
        await self.wait_for(lambda: self.status_is(unknown, RunStatus.PARKED), "the unknown effect to park")
        self.stop(rescuer)
        parked = await self.store.get_run(unknown)
        unknown_types = [e.type for e in await self.store.history(unknown)]
        ambiguous = unknown_types[-1] == "effect_ambiguous" and self.counts(unknown)["write"] == 1
        self.end(s5, with_evidence and ambiguous,
                 f"evidence applied: {' -> '.join(types[1:])}; body ran {self.counts(applied)['write']} time(s): replayed",
                 f"evidence unknown: {' -> '.join(unknown_types[1:])}; run {parked.status}: ambiguous, waiting for an operator")

        s6 = self.begin("6", "deploy version 2 while a version 1 run waits")
        old = self.checkpoint("deploy-v1")
        await self.store.enqueue(WorkflowTask("runifold-drill-deploy", 1, {"checkpoint": old}, checkpoint_id=old))
        v1_worker = self.spawn("drill-v1")
        await self.wait_for(lambda: self.status_is(old, RunStatus.WAITING), "the v1 run to wait on its timer")
        self.stop(v1_worker)
        deployed = self.spawn("drill-v2", app="registry_v2")
        new = self.checkpoint("deploy-v2")
        await self.store.enqueue(WorkflowTask("runifold-drill-deploy", 2, {"checkpoint": new}, checkpoint_id=new))
        await self.wait_for(lambda: self.status_is(old, RunStatus.COMPLETED), "the v1 run to finish")
        await self.wait_for(lambda: self.status_is(new, RunStatus.COMPLETED), "the v2 run to finish")
        old_result = fold(await self.entries(old)).result
        new_result = fold(await self.entries(new)).result
        versions = registry_v2.versions()
        self.stop(deployed)
        self.end(s6, old_result == {"code": "v1"} and new_result == {"code": "v2"}
                 and ("runifold-drill-deploy", 1) in versions and ("runifold-drill-deploy", 2) in versions,
                 f"registered after deploy: {[f'{n} v{v}' for n, v in versions if n.endswith('deploy')]}",
                 f"v1 run (waited on a timer across the deploy) finished with {old_result}; new v2 run finished with {new_result}")

    def _past(self, ts: float) -> object:
        async def check() -> bool:
            return await self.store.now() > ts + 0.05

        return check()

    async def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for cid in self.checkpoints:
            try:
                info = await self.store.get_run(cid)
            except Exception:
                continue
            if not info.status.finished:
                await cancel_run(self.store, cid, by="runifold-drill", reason="drill clean-up")
            await self.store.purge(cid)


async def run_drill(url: str, on_step: Callable[[DrillStep], None] = lambda s: None) -> DrillReport:
    """Run the drill against the store at ``url``; return its report (``report.passed``)."""
    report = DrillReport()
    store = await open_store(url)
    with tempfile.TemporaryDirectory(prefix="runifold-drill-") as folder:
        drill = _Drill(url, store, Path(folder), report, on_step)
        try:
            await drill.run()
        except AssertionError as exc:
            failed = DrillStep("!", "drill stopped", False, [str(exc)])
            report.steps.append(failed)
            on_step(failed)
        finally:
            await drill.cleanup()
            await store.close()
    return report
