"""The import direction is a rule, not a convention: checked at run time and by import-linter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "module",
    ["core", "core.agent", "core.loop", "core.recovery", "core.checkpoint.sqlite", "core.providers.faux"],
)
def test_core_module_loads_no_ui(module: str) -> None:
    """Importing any core module pulls in neither textual, rich nor tui."""
    code = (
        f"import sys, {module}\n"
        "bad = sorted(m for m in ('textual', 'rich', 'tui') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"


def test_faux_provider_does_not_load_anthropic() -> None:
    """Only core.providers.anthropic may import the anthropic SDK."""
    code = "import sys, core.agent, core.providers.faux; print('anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_import_linter_contracts_hold() -> None:
    """The layer and independence contracts in pyproject.toml are kept."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "lint-imports is missing: install the test extra (pip install -e '.[test]')"
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
