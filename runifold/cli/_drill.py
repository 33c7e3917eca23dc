"""``runifold drill``: run the recovery drill against a store and print its report."""

from __future__ import annotations

import argparse
import time

from runifold.drill import DrillStep, run_drill


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drill = sub.add_parser("drill", help="the recovery drill: kill real workers against --store and check recovery")
    drill.set_defaults(handler=drill_cmd)


def _print(step: DrillStep) -> None:
    print(f"{'PASS' if step.passed else 'FAIL'}  {step.number}. {step.title}", flush=True)
    for line in step.evidence:
        print(f"        {line}", flush=True)


async def drill_cmd(args: argparse.Namespace) -> int:
    print(f"recovery drill against {args.store.split('@')[-1]}", flush=True)
    started = time.monotonic()
    report = await run_drill(args.store, _print)
    verdict = "passed" if report.passed else "FAILED"
    print(f"drill {verdict}: {sum(s.passed for s in report.steps)}/{len(report.steps)} steps in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    return 0 if report.passed else 1
