"""The shell around the screens: command line, provider choice, default database, help, palette."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.checkpoint.memory import MemoryCheckpointer
from tests.tui.conftest import fast_session, screen_text, wait_for, wait_for_text
from tui import cli
from tui.app import CubepiApp, make_app
from tui.screens.modals import HelpScreen
from tui.screens.threads import ThreadsScreen


def test_help_explains_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    for needle in ("--demo", "--model", "--thread", "--no-create", "--demo-speed", "ANTHROPIC_API_KEY", "created"):
        assert needle in done.stdout, needle


def test_provider_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert cli.build_session(store=MemoryCheckpointer()).model == "demo"  # no key: the demo agent
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert cli.build_session(store=MemoryCheckpointer()).model == cli.DEFAULT_MODEL
    assert cli.build_session(store=MemoryCheckpointer(), demo=True).model == "demo"
    assert cli.build_session(store=MemoryCheckpointer(), model="claude-x").model == "claude-x"


async def test_default_database_is_created_in_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "data" / "cubepi-tui" / "threads.sqlite"
    monkeypatch.setattr(cli, "default_db_path", lambda: target)
    app = make_app(cli.build_session(demo=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        assert str(target) in " ".join(screen_text(app).split())
    assert target.exists()


async def test_help_screen_and_palette_commands() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        assert "Crash points" in screen_text(app) and "steer" in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="closed")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert titles[:4] == ["New thread", "Threads", "Reload threads", "Help"]


def test_bindings_have_ids_and_tooltips() -> None:
    from textual.binding import Binding

    from tui.screens.thread import ThreadScreen

    for owner in (CubepiApp, ThreadsScreen, ThreadScreen):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding)
            assert binding.id and binding.tooltip, (owner.__name__, binding.key)
