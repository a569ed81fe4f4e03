"""The shell around the screens: command line, provider choice, default database, help, palette."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.checkpoint import locations
from core.checkpoint.memory import MemoryCheckpointer
from tests.helpers.tui import fast_session, screen_text, wait_for, wait_for_text
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


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["--bogus"], "cubepi-tui: Unrecognized arguments: --bogus (see --help)."),
        (
            ["--demo-speed", "0"],
            "cubepi-tui: Argument --demo-speed: expected a number above zero, not '0' (see --help).",
        ),
    ],
    ids=["unknown flag", "bad value"],
)
def test_bad_arguments_get_one_sentence_and_status_2(argv: list[str], sentence: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr == sentence + "\n"  # no usage lines before it
    assert done.stdout == ""


def test_help_mentions_the_run_subcommand() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "cubepi-tui run --db URL|PATH --thread ID" in done.stdout and "--resume" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "run", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    for needle in ("cubepi-tui run", "--db", "--thread", "--resume", "--include-pending", "--demo"):
        assert needle in done.stdout, needle


def test_run_subcommand_never_imports_textual() -> None:
    code = (
        "import sys\n"
        "from tui.cli import main\n"
        "try:\n"
        "    main(['run', '--help'])\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "assert 'textual' not in sys.modules and 'rich' not in sys.modules, 'the run subcommand imported the UI'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


async def test_run_subcommand_runs_the_demo_headless_into_the_database(tmp_path: Path) -> None:
    from core.checkpoint.sqlite import SQLiteCheckpointer
    from core.recovery import ThreadState, diagnose

    db = tmp_path / "headless.sqlite"
    argv = [
        sys.executable,
        "-m",
        "tui.cli",
        "run",
        "--db",
        str(db),
        "--thread",
        "t-cli",
        "--demo",
        "--speed",
        "25",
        "Summarise the sales",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "run completed"
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        data = await store.load("t-cli")
    finally:
        await store.close()
    assert data is not None and data.messages[0].text == "Summarise the sales"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


async def test_a_second_prompt_in_a_thread_does_the_demo_work_again() -> None:
    """The demo's tools are idempotent, so identical arguments would reuse the first jobs
    and return at once; each request's calls carry its number, so new work is done."""
    from core.agent import Agent
    from core.demo import SYSTEM_PROMPT, demo_provider, demo_tools
    from core.messages import AssistantMessage, ToolResultMessage

    store = MemoryCheckpointer()
    agent = Agent(demo_provider(speed=50), store, "t", tools=demo_tools(speed=50), system_prompt=SYSTEM_PROMPT)
    assert await agent.prompt("first") == "completed"
    assert await agent.prompt("second") == "completed"
    data = await store.load("t")
    assert data is not None
    calls = [c for m in data.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    assert sorted({c.arguments["request"] for c in calls}) == [1, 2]
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert len(results) == 6 and not any((r.metadata or {}).get("job") == "reused" for r in results)


def test_provider_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert cli.build_session(store=MemoryCheckpointer()).config.model == "demo"  # no key: the demo agent
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert cli.build_session(store=MemoryCheckpointer()).config.model == cli.DEFAULT_MODEL
    assert cli.build_session(store=MemoryCheckpointer(), demo=True).config.model == "demo"
    assert cli.build_session(store=MemoryCheckpointer(), model="claude-x").config.model == "claude-x"


async def test_default_database_is_created_in_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "data" / "cubepi-tui" / "threads.sqlite"
    monkeypatch.setattr(locations, "default_sqlite_path", lambda: target)
    app = make_app(cli.build_session(demo=True))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        assert str(target) in " ".join(screen_text(app).split())
    assert target.exists()


async def test_help_screen_and_palette_commands() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    # Tall enough for the whole help (it scrolls on a smaller terminal), so its last section shows.
    async with app.run_test(size=(100, 60)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await wait_for(
            pilot, lambda: "Crash points" in screen_text(app) and "steer" in screen_text(app), what="help drawn"
        )
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="closed")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert titles[:4] == ["New thread", "Threads", "Reload threads", "Help"]


async def test_help_is_one_kept_screen_that_closes_each_time_it_is_shown() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(100, 60)) as pilot:  # the whole help shows (see above)
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        shown: list[HelpScreen] = []
        for key in ("escape", "q", "question_mark"):  # each of its closing keys, on a later showing
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            await wait_for(pilot, lambda: "Crash points" in screen_text(app), what="help drawn")
            assert isinstance(app.screen, HelpScreen)
            shown.append(app.screen)
            await pilot.press(key)
            await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what=f"closed by {key}")
        assert shown[0] is shown[1] is shown[2]
        assert not any(isinstance(screen, HelpScreen) for screen in app.screen_stack)


def test_bindings_have_ids_and_tooltips() -> None:
    from textual.binding import Binding

    from tui.screens.thread import ThreadScreen

    for owner in (CubepiApp, ThreadsScreen, ThreadScreen):
        for binding in owner.BINDINGS:
            assert isinstance(binding, Binding)
            assert binding.id and binding.tooltip, (owner.__name__, binding.key)
