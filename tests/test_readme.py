"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_examples_run(tmp_path: Path) -> None:
    """Every ```python block of the README (complete programs; fragments are fenced ```py) runs in a fresh interpreter."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for i, block in enumerate(blocks):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        if "run_once()" in block:
            assert "Completed(" in result.stdout


def test_testing_guide_examples_run(tmp_path: Path) -> None:
    """Every ```python block of docs/testing.md runs as written (they assert what the guide says)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(), re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        script = tmp_path / f"test_testing{i}.py"
        script.write_text(block)
        # a test module (the conformance suite over a store of your own) runs under pytest, as the guide says
        command = (["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", str(script)]
                   if "StoreConformance)" in block else [str(script)])
        result = subprocess.run([sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        if command[0] == "-m":
            assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout
