"""Run every benchmark on SQLite and PostgreSQL and write the results table.

    make bench                      # starts a throwaway PostgreSQL, runs everything
    python benchmarks/run.py --only sqlite --quick
    python benchmarks/run.py --smoke  # the smallest sizes, as the test suite runs it

Every figure is reported next to the raw limit measured in the same run, on the
same store and durability settings, as a ratio: absolute times on a shared
2-core machine are noise. Results go to stdout and into benchmarks/README.md
between the RESULTS markers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
from pathlib import Path

import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import _limits, _workloads  # noqa: E402


def machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


async def main(args: argparse.Namespace) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    stores = []
    if args.only in (None, "sqlite"):
        stores.append("sqlite")
    if args.only in (None, "postgres"):
        if not os.environ.get("RUNIFOLD_TEST_POSTGRES"):
            print("no RUNIFOLD_TEST_POSTGRES: skipping PostgreSQL (run through `make bench`)", file=sys.stderr)
        else:
            stores.append("postgres")
    rows: list[list[str]] = []
    scale = 0.01 if args.smoke else 0.2 if args.quick else 1.0
    for kind in stores:
        limits = await _limits.measure(kind)
        for line in limits.describe():
            print(f"[{kind}] raw limit: {line}", flush=True)
        for result in await _workloads.run_all(kind, limits, scale, args.bench):
            rows.append([kind, *result])
    table = ["| store | benchmark | result | against the raw limit |", "|---|---|---|---|"]
    table += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |" for r in rows]
    text = "\n".join([f"Machine: {machine()}.", "", *table])
    print("\n" + text)
    if not (args.quick or args.smoke) and args.only is None and args.bench is None:
        readme = ROOT / "benchmarks" / "README.md"
        body = readme.read_text()
        start, end = "<!-- RESULTS -->", "<!-- /RESULTS -->"
        head, rest = body.split(start, 1)
        tail = rest.split(end, 1)[1]
        readme.write_text(f"{head}{start}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--quick", action="store_true", help="smaller sizes; does not update the README")
    parser.add_argument("--smoke", action="store_true", help="the smallest sizes (the test suite's smoke run)")
    parser.add_argument("--bench", action="append", choices=sorted(_workloads.BENCHMARKS),
                        help="run only this benchmark (repeatable); does not update the README")
    asyncio.run(main(parser.parse_args()))
