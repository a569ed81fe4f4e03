"""The user's keymap (``tui.keymap``) and the one table of actions (``tui.actions``):
a remapped key runs its action and the old key no longer does, a remapped greyed key says
why it does nothing, the help names the remapped keys, a bad file is one sentence and the
default keys; and the footers fit 80 columns with "? Help" in view."""

from __future__ import annotations

from pathlib import Path

from textual.app import App

from core.checkpoint.memory import MemoryCheckpointer
from core.messages import AssistantMessage, TextContent, user_text
from tests.helpers.screens import running_tool
from tests.helpers.tui import fast_session, screen_text, send_via_dialog, squeezed_lines, wait_for
from tui.actions import BY_ID
from tui.app import make_app
from tui.cli import parse_args
from tui.keymap import KEYMAP_ENV, UserKeymap, keymap_path, load_keymap
from tui.screens.modals import HelpScreen, TextInputModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen

TIMEOUT = 60.0
"""Seconds any wait may take (generous: a loaded 2-core machine)."""


def _notices(app: App[object]) -> list[str]:
    return [n.message for n in app._notifications]  # type: ignore[attr-defined]


def _footer(app: App[object]) -> str:
    return screen_text(app).splitlines()[-1]


async def _completed_thread() -> MemoryCheckpointer:
    store = MemoryCheckpointer()
    await store.append(
        "done", [user_text("hi"), AssistantMessage(content=[TextContent(text="hello")], stop_reason="stop")]
    )
    return store


# --- the file ---------------------------------------------------------------------------


def test_the_keymap_is_the_option_then_the_variable_then_the_config_directory(tmp_path: Path) -> None:
    env = {KEYMAP_ENV: str(tmp_path / "env.toml"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    assert keymap_path(tmp_path / "given.toml", env) == (tmp_path / "given.toml", True)
    assert keymap_path(None, env) == (tmp_path / "env.toml", True)
    assert keymap_path(None, {"XDG_CONFIG_HOME": str(tmp_path / "config")}) == (
        tmp_path / "config" / "cubepi-tui" / "keymap.toml",
        False,
    )
    assert parse_args(["--keymap", str(tmp_path / "k.toml")]).keymap == str(tmp_path / "k.toml")


def test_a_keymap_file_is_read_into_binding_ids_and_keys(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.abort" = "ctrl+a"\n"thread.steer" = "m, M"\n')
    assert load_keymap(path) == UserKeymap(keys={"thread.abort": "ctrl+a", "thread.steer": "m,M"})


def test_a_key_moved_from_one_action_to_another_is_no_clash(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.abort" = "s"\n"thread.steer" = "ctrl+s"\n')
    assert load_keymap(path) == UserKeymap(keys={"thread.abort": "s", "thread.steer": "ctrl+s"})


def test_the_readme_names_every_action_id() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    missing = [action_id for action_id in BY_ID if f"`{action_id}`" not in readme]
    assert not missing, missing


def test_no_default_file_is_no_keymap_and_no_complaint(tmp_path: Path) -> None:
    assert load_keymap(None, {"XDG_CONFIG_HOME": str(tmp_path)}) == UserKeymap()


def test_a_bad_keymap_file_is_one_sentence_and_no_keys(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    cases = {
        '[keys]\n"thread.abortt" = "z"\n': "it names no action 'thread.abortt' (the README lists them).",
        "[keys\n": "it is not TOML (",
        '[keys]\n"thread.abort" = 3\n': "its 'thread.abort' is not one or more key names separated by commas: 3.",
        '[colors]\nbg = "red"\n': "it holds 'colors', and only a [keys] table is read.",
        # s stays the steer's key, so giving it to abort would silently take it from steer.
        '[keys]\n"thread.abort" = "s"\n': "it binds 's' to both 'thread.abort' and 'thread.steer'.",
        '[keys]\n"threads.filter" = "question_mark"\n': "it binds '?' to both 'threads.filter' and 'app.help'.",
    }
    for text, why in cases.items():
        path.write_text(text)
        keymap = load_keymap(path)
        assert keymap.keys == {}, text
        assert keymap.problem is not None and keymap.problem.startswith(
            f"The keymap {str(path)!r} was not used, so the default keys apply: {why}"
        ), keymap.problem
    missing = load_keymap(tmp_path / "nowhere.toml")
    assert missing.problem == (
        f"The keymap {str(tmp_path / 'nowhere.toml')!r} was not used, so the default keys apply: there is no such file."
    )


# --- in the app -------------------------------------------------------------------------


async def test_a_remapped_key_runs_its_action_and_the_old_key_no_longer_does(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.prompt" = "ctrl+n"\n"threads.open" = "o"\n')
    app = make_app(fast_session(await _completed_thread()), keymap=load_keymap(path))
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen) and bool(app.screen.rows), what="rows")
        await pilot.pause()
        await pilot.press("o")  # opens the thread under the cursor, as Enter did
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        screen = app.screen
        await pilot.press("n")
        await pilot.pause(0.3)
        assert app.screen is screen  # n is no longer bound: no prompt dialog
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the prompt dialog of ctrl+n")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is screen, what="the dialog closed")


async def test_a_remapped_greyed_key_says_why_it_does_nothing(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.resume" = "R"\n"thread.prompt" = "N"\n')
    app = make_app(fast_session(await _completed_thread()), thread_id="done", keymap=load_keymap(path))
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        await pilot.press("R")
        await wait_for(pilot, lambda: any("Nothing to resume" in n for n in _notices(app)), what="the why-not")
        # The sentence names the keys as remapped.
        assert "Nothing to resume: the thread completed; press N to send a new prompt." in _notices(app)
        app.clear_notifications()
        await pilot.press("r")  # the old key: nobody's now, so it says nothing
        await pilot.pause(0.3)
        assert not any("Nothing to resume" in n for n in _notices(app))


async def test_the_help_lists_the_remapped_keys(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.abort" = "ctrl+a"\n"thread.edit_queued" = "ctrl+e"\n"threads.filter" = "f"\n')
    app = make_app(fast_session(MemoryCheckpointer()), keymap=load_keymap(path))
    async with app.run_test(size=(100, 60)) as pilot:  # tall enough for the whole help
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await wait_for(pilot, lambda: "Crash points" in screen_text(app), what="help drawn")
        text = squeezed_lines(screen_text(app))
        assert "ctrl+a abort the run" in text
        assert "(as ctrl+a does)" in text  # keys named in another key's line follow too
        assert "c ctrl+e D select a queued steer" in text and "ctrl+e edits it" in text
        assert "f filter the list as you type" in text
        assert " a abort the run" not in f" {text}" and "(as a does)" not in text
        await pilot.press("escape")
        # Remapped while the app runs: the kept help screen shows the new keys next time.
        app.update_keymap({"thread.abort": "ctrl+b"})
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "ctrl+b abort the run" in squeezed_lines(screen_text(app)), what="new keys")


async def test_a_bad_keymap_file_is_one_notice_and_the_default_keys(tmp_path: Path) -> None:
    path = tmp_path / "keymap.toml"
    path.write_text('[keys]\n"thread.abort" = "ctrl+a"\n"no.such" = "z"\n')
    app = make_app(fast_session(await _completed_thread()), thread_id="done", keymap=load_keymap(path))
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded, what="loaded")
        (notice,) = [n for n in _notices(app) if "keymap" in n]
        assert notice == (
            f"The keymap {str(path)!r} was not used, so the default keys apply: "
            "it names no action 'no.such' (the README lists them)."
        )
        app.clear_notifications()
        await pilot.press("a")  # the default key, not ctrl+a: the file was ignored as a whole
        await wait_for(pilot, lambda: any("Nothing to abort" in n for n in _notices(app)), what="a's why-not")


# --- the footers at 80 columns ------------------------------------------------------------


async def test_the_footers_fit_80_columns_with_help_on_the_picker_and_while_a_run_streams() -> None:
    session = fast_session(MemoryCheckpointer(), speed=3.0)
    app = make_app(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.session.store is not None, what="store open")
        await wait_for(pilot, lambda: "? Help" in _footer(app), what="help in the picker's footer")
        picker = _footer(app)
        for words in ("Open", "Filter", "! Attention", "n New thread", "q Quit", "^p palette"):
            assert words in picker, picker
        await send_via_dialog(pilot, "n", "build a report")
        await wait_for(pilot, lambda: running_tool(app), timeout=TIMEOUT, what="a tool running")
        assert isinstance(app.screen, ThreadScreen)
        screen = app.screen
        await wait_for(pilot, lambda: "a Abort" in _footer(app), what="the running keys")
        footer = _footer(app)
        # Every key of a running thread fits, with shorter labels; the help says the rest.
        for words in ("a Abort", "A Stop", "s Steer", "S Now", "f Follow", "o Note", "q Back", "? Help"):
            assert words in footer, footer
        await pilot.press("a")
        await wait_for(pilot, lambda: not screen.running, timeout=TIMEOUT, what="aborted")


async def test_a_wide_footer_keeps_the_full_labels() -> None:
    app = make_app(fast_session(MemoryCheckpointer()))
    async with app.run_test(size=(160, 24)) as pilot:
        await wait_for(pilot, lambda: "? Help" in _footer(app), what="help in the footer")
        for words in ("D Delete", "r Reload", "n New thread"):
            assert words in _footer(app), _footer(app)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: "r Reload" not in _footer(app), what="the footer refitted")
        assert "? Help" in _footer(app)
