"""``runifold drill``: run the recovery drill against a store and print its report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

from runifold.cli._common import emit_json, printable, refuse_memory, refuse_readonly
from runifold.drill import DrillStep, run_drill
from runifold.stores._open import redacted


#: the exit status of a drill stopped by SIGTERM (128 + 15, as a shell reports a process it ended)
EXIT_TERMINATED = 143


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drill = sub.add_parser("drill", help="the recovery drill: kill real workers against --store and check recovery")
    drill.set_defaults(handler=drill_cmd)


def _print(step: DrillStep) -> None:
    print(f"{'PASS' if step.passed else 'FAIL'}  {step.number}. {step.title}", flush=True)
    for line in step.evidence:
        print(f"        {printable(line)}", flush=True)


def _emit(step: DrillStep) -> None:
    emit_json({"step": step.number, "title": step.title, "passed": step.passed, "evidence": step.evidence})


async def drill_cmd(args: argparse.Namespace) -> int:
    refuse_memory(args)  # its workers are processes of their own
    refuse_readonly(args)  # the drill writes its runs
    if not args.json:
        print(f"recovery drill against {redacted(args.store).split('@')[-1]}", flush=True)  # (no password)
    started = time.monotonic()
    # SIGTERM stops the drill as Ctrl-C does: its workers are stopped and its runs purged before it exits
    loop, task, terminated = asyncio.get_running_loop(), asyncio.current_task(), asyncio.Event()

    def terminate() -> None:
        terminated.set()
        if task is not None:
            task.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        report = await run_drill(args.store, _emit if args.json else _print)
    except asyncio.CancelledError:
        print("runifold: drill interrupted; its workers were stopped and its runs purged", file=sys.stderr, flush=True)
        if terminated.is_set():
            return EXIT_TERMINATED
        raise  # Ctrl-C: asyncio.run turns it into KeyboardInterrupt (exit 130)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
    passed = sum(s.passed for s in report.steps)
    elapsed = time.monotonic() - started
    if args.json:
        emit_json({"passed": report.passed, "steps": len(report.steps), "steps_passed": passed,
                   "seconds": round(elapsed, 1)})
    else:
        print(f"drill {'passed' if report.passed else 'FAILED'}: {passed}/{len(report.steps)} steps in "
              f"{elapsed:.1f} s", flush=True)
    return 0 if report.passed else 1
