"""Bad input reaches the screen as one clear sentence; the app keeps running and q quits."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from core.checkpoint.base import thread_unavailable
from core.checkpoint.memory import MemoryCheckpointer
from core.owners import UNOWNED
from core.providers.faux import FauxProvider
from tests.helpers.tui import (
    fast_session,
    fill_dialog,
    open_from_picker,
    screen_text,
    squeezed,
    wait_for,
    wait_for_text,
)
from tui.app import make_app
from tui.cli import build_session
from tui.screens.modals import ErrorScreen, TextInputModal
from tui.screens.threads import ThreadsScreen
from tui.session import Session
from tui.session_config import SessionConfig


def _error_sentence(app) -> str:  # type: ignore[no-untyped-def]
    assert isinstance(app.screen, ErrorScreen), type(app.screen)
    return app.screen.sentence


async def _expect_error(app, fragment: str, quit_key: str = "q") -> str:  # type: ignore[no-untyped-def]
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="error screen")
        # The screen is pushed before it is drawn: wait for its sentence on screen, not one pause.
        await wait_for(
            pilot, lambda: squeezed(_error_sentence(app)) in squeezed(screen_text(app)), what="the sentence drawn"
        )
        sentence = _error_sentence(app)
        text = screen_text(app)
        assert fragment in sentence
        assert "Traceback" not in text
        assert sentence.count(". ") == 0 and sentence.endswith(".")  # one sentence
        assert squeezed(sentence) in squeezed(text), text  # and it is on screen
        assert app.is_running
        fatal = app.screen.fatal
        await pilot.press(quit_key)
        await pilot.pause()
        assert not app.is_running
    # A fatal error (the app could not start) says so in the exit status.
    assert app.return_code == (1 if fatal else 0)
    return sentence


@pytest.mark.parametrize("quit_key", ["q", "ctrl+q"])
async def test_not_a_database(tmp_path: Path, quit_key: str) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("these are my notes, not a database\n" * 100)
    before = path.read_bytes()
    await _expect_error(make_app(build_session(path, demo=True)), "notes.sqlite", quit_key)
    assert path.read_bytes() == before


async def test_missing_file_in_a_read_only_directory() -> None:
    # Tests run as root, for whom chmod does not make a directory read-only; /proc is
    # read-only even for root, so creating a file there fails honestly.
    path = Path("/proc/cubepi-tui-test.sqlite")
    assert not path.exists()
    await _expect_error(make_app(build_session(path, demo=True)), "cubepi-tui-test.sqlite")
    assert not path.exists()


async def test_missing_file_whose_parent_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    await _expect_error(make_app(build_session(blocker / "threads.sqlite", demo=True)), "threads.sqlite")


async def test_missing_file_with_no_create(tmp_path: Path) -> None:
    path = tmp_path / "absent.sqlite"
    await _expect_error(make_app(build_session(path, create=False, demo=True)), "absent.sqlite")
    assert not path.exists()


async def test_malformed_json_row(fixture_copy: Path) -> None:
    with sqlite3.connect(fixture_copy) as db:
        db.execute("UPDATE messages SET message_json = ? WHERE id = 9", ('{"role": "tool_result", "content": [',))
    app = make_app(fast_session(path=fixture_copy, owner=UNOWNED))
    async with app.run_test(size=(120, 40)) as pilot:
        await open_from_picker(pilot, "completed")
        await wait_for_text(pilot, "Row 9 could not be read")
        text = screen_text(app)
        assert "malformed JSON" in text
        assert '{"role": "tool_result", "content": [' in text  # the raw row, shown as is
        assert "Traceback" not in text
        # Continuing the thread is refused with one sentence, before a prompt is asked for
        # (so nothing typed is lost), and nothing is written.
        rows = _row_count(fixture_copy, "completed")
        await pilot.press("n")
        await wait_for(
            pilot,
            lambda: "has 1 unreadable row (first: row 9)" in " ".join(n.message for n in app._notifications),
            what="refusal",
        )
        assert not isinstance(app.screen, TextInputModal)
        assert app.is_running
    assert _row_count(fixture_copy, "completed") == rows


def _row_count(path: Path, thread_id: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM messages WHERE thread_id = ?", (thread_id,)).fetchone()[0]


async def test_unknown_thread_id() -> None:
    app = make_app(fast_session(MemoryCheckpointer()), thread_id="no-such-thread")
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="error screen")
        sentence = str(thread_unavailable("no-such-thread", app.session.owner))
        assert _error_sentence(app) == sentence
        await wait_for_text(pilot, "Thread 'no-such-thread' is unavailable")  # drawn after the push
        await pilot.press("escape")  # back to the picker, still running
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")


async def test_missing_api_key_when_a_model_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    session = build_session(store=MemoryCheckpointer(), model="claude-sonnet-4-5")
    app = make_app(session)
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), what="error screen")
        assert "ANTHROPIC_API_KEY" in _error_sentence(app)
        await wait_for_text(pilot, "ANTHROPIC_API_KEY")  # drawn after the push
        await pilot.press("escape")  # browsing still works
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="picker")
        await fill_dialog(pilot, "n", "hello")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("ANTHROPIC_API_KEY" in n.message for n in app._notifications), what="refusal")
        assert app.is_running


async def test_provider_error_during_a_run() -> None:
    store = MemoryCheckpointer()

    async def open_store() -> MemoryCheckpointer:
        return store

    session = Session(
        SessionConfig(open_store, lambda: FauxProvider(), model="faux-1")
    )  # an empty script fails the call
    app = make_app(session)
    async with app.run_test(size=(110, 30)) as pilot:
        await fill_dialog(pilot, "n", "hello")
        await pilot.press("enter")
        await wait_for_text(pilot, "the model call failed: The faux provider has no scripted reply left")
        assert "failed" in screen_text(app).splitlines()[-2]
        assert any("no scripted reply" in n.message for n in app._notifications)
        assert app.is_running
