"""The ui tests' harness: a store filled by running workflows, `runifold ui` serving it, headless Chromium.

Chromium is Debian's (/usr/bin/chromium, `apt-get install chromium`), driven
by the Playwright Python package; Playwright's own browser download is never
used. Screenshots of each page go to tests/ui/screenshots/ (or
$RUNIFOLD_UI_SCREENSHOTS); the run's summary names the directory.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from runifold import open_store
from tests.conftest import require_postgres, reset_postgres
from tests.ui.app import Filled, fill

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.ui.app:registry"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(os.environ.get("RUNIFOLD_UI_SCREENSHOTS", Path(__file__).parent / "screenshots"))
_taken: list[Path] = []
T = TypeVar("T")


def require_chromium() -> None:
    """Skip locally without Debian's Chromium; fail in CI, whose .ci/run installs it."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium before `make test`")
        pytest.skip(f"no {CHROMIUM} (apt-get install chromium)")


def cli_env(store_url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RUNIFOLD_STORE": store_url, "RUNIFOLD_APP": APP}


def runifold(store_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI against ``store_url`` and return what it did."""
    return subprocess.run([sys.executable, "-m", "runifold.cli", *args], cwd=ROOT, env=env or cli_env(store_url),
                          capture_output=True, text=True, timeout=120)


def start_ui(store_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start `runifold ui --port 0` and return the process and the URL it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "runifold.cli", "ui", "--port", "0", *args], cwd=ROOT,
                            env=env or cli_env(store_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if "http://" not in line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"runifold ui did not start: {line!r} {err!r}")
    return proc, line[line.index("http://"):].split()[0]


def stop_ui(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """SIGTERM the server; return its exit code and the rest of its output."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


@dataclass
class Served:
    """One filled store and `runifold ui` serving it."""

    kind: str
    store_url: str
    url: str
    filled: Filled

    def store(self) -> Any:
        return open_store(self.store_url)

    def shot(self, page: Any, name: str) -> Path:
        """Save a full-page screenshot of ``page`` as ``<store kind>-<name>.png``."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.kind}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        _taken.append(path)
        return path


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end on a thread of its own: Playwright's sync API keeps a loop running on this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def _fill(store_url: str) -> Filled:
    store = await open_store(store_url)
    try:
        return await fill(store)
    finally:
        await store.close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A store of each kind filled by running workflows, and `runifold ui` serving it (stopped with SIGTERM)."""
    if request.param == "sqlite":
        store_url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'ui.db'}"
    else:
        store_url = require_postgres()
        run_async(lambda: reset_postgres(store_url))
    filled = run_async(lambda: _fill(store_url))
    proc, url = start_ui(store_url)
    yield Served(request.param, store_url, url, filled)
    code, out, err = stop_ui(proc)
    assert code == 0 and "runifold ui: stopped" in out, (code, out, err)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, with a fresh profile, driven by Playwright.

    Module-scoped: Playwright's sync API keeps an event loop running on this thread while it is open,
    and the async tests of later modules need the thread without one.
    """
    require_chromium()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="runifold-chromium-") as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1360, "height": 900})
        yield context
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A new tab; any page error (a script that ran, a failed load) fails the test."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    yield tab
    tab.close()
    assert not errors, errors


def wait_until(check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _taken:
        terminalreporter.write_line(f"ui screenshots ({len(_taken)}): {SCREENSHOTS}")
