"""``runifold drill``: run the recovery drill against a store and print its report."""

from __future__ import annotations

import argparse
import time

from runifold.cli._common import emit_json, printable, refuse_memory, refuse_readonly
from runifold.drill import DrillStep, run_drill


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
        print(f"recovery drill against {args.store.split('@')[-1]}", flush=True)
    started = time.monotonic()
    report = await run_drill(args.store, _emit if args.json else _print)
    passed = sum(s.passed for s in report.steps)
    elapsed = time.monotonic() - started
    if args.json:
        emit_json({"passed": report.passed, "steps": len(report.steps), "steps_passed": passed,
                   "seconds": round(elapsed, 1)})
    else:
        print(f"drill {'passed' if report.passed else 'FAILED'}: {passed}/{len(report.steps)} steps in "
              f"{elapsed:.1f} s", flush=True)
    return 0 if report.passed else 1
