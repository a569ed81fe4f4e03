"""Lint and format are rules, not advice: ruff (settings in pyproject.toml) over the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> str:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert exe, "ruff is missing: install the test extra (pip install -e '.[test]')"
    return exe


@pytest.mark.parametrize(
    ("what", "args"),
    [("lint", ["check", "--no-cache", "."]), ("format", ["format", "--check", "--no-cache", "."])],
)
def test_ruff_finds_nothing(what: str, args: list[str]) -> None:
    """``ruff check`` and ``ruff format --check`` pass on every file of the repository."""
    out = subprocess.run([_ruff(), *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"ruff {what} failed:\n{out.stdout}{out.stderr}"
