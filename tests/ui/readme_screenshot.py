"""Make docs/ui-runs.png, the README's screenshot: `runifold ui` over a store filled by tests/ui/app.py.

Run it from the repository's root: ``.venv/bin/python -m tests.ui.readme_screenshot``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from runifold import open_store
from tests.ui.app import fill
from tests.ui.conftest import APP, CHROMIUM, CHROMIUM_ARGS, ROOT, stop_ui

OUT = ROOT / "docs" / "ui-runs.png"


async def _fill(url: str) -> None:
    store = await open_store(url)
    try:
        await fill(store, bulk_runs=0)
    finally:
        await store.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = "sqlite:///runifold-workflows.db"  # relative to tmp: the page shows the URL as given
        os.chdir(tmp)
        asyncio.run(_fill(url))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "runifold.cli", "--store", url, "--app", APP, "ui", "--port",
                                 "0"], cwd=tmp, env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        address = line[line.index("http://"):].split()[0]
        try:
            with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
                browser = playwright.chromium.launch_persistent_context(
                    profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                    viewport={"width": 1360, "height": 520})
                page = browser.new_page()
                page.goto(address + "runs?refresh=0")
                page.screenshot(path=str(OUT))
                browser.close()
        finally:
            stop_ui(proc)
    print(f"wrote {Path(OUT).relative_to(ROOT)} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
