"""Owners in the app, on every backend: the picker lists only the current owner's threads
and says whose they are ("threads of alice · 2"), the empty list counts only threads that
record no owner, and another owner's thread cannot be opened, prompted, resumed, commanded
or deleted - each refusal reads exactly as for a thread that does not exist. Deleting
(``D``) asks first and is refused while a run holds the thread."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from core.checkpoint.base import Checkpointer, Lease, thread_unavailable
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import CubepiError, ThreadNotFoundError
from core.messages import user_text
from core.owners import UNOWNED
from tests.helpers.store_backends import BACKEND_PARAMS, new_location
from tests.helpers.tui import fast_session, screen_text, squeezed_lines, wait_for, wait_for_text, widget_text
from tui.app import make_app
from tui.screens.modals import ConfirmModal, ErrorScreen
from tui.screens.threads import ThreadsScreen
from tui.widgets.thread_table import ThreadTable

Opener = Callable[[str], Awaitable[Checkpointer]]


@pytest.fixture(params=[pytest.param("memory", id="memory"), *BACKEND_PARAMS])
async def opener(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Opener]:  # type: ignore[no-untyped-def]
    """``await opener(owner)``: another store object on one store of the backend, opened for
    ``owner``; each is closed at the end (the app closes the one it was given itself)."""
    opened: list[Checkpointer] = []
    if request.param == "memory":
        base = MemoryCheckpointer("nobody")

        async def open_memory(owner: str) -> Checkpointer:
            return MemoryCheckpointer(owner, shared=base)

        yield open_memory
        return
    from core.checkpoint.locations import open_store

    async with new_location(request.param, tmp_path, "owners") as location:
        first = True

        async def open_server(owner: str) -> Checkpointer:
            nonlocal first
            store = await open_store(location, create=first, owner=owner)
            first = False
            opened.append(store)
            return store

        try:
            yield open_server
        finally:
            for store in opened:
                await store.close()


async def _thread(store: Checkpointer, thread_id: str, text: str) -> None:
    await store.append(thread_id, [user_text(text)])


def _picker(app) -> ThreadsScreen:  # type: ignore[no-untyped-def]
    assert isinstance(app.screen, ThreadsScreen), type(app.screen)
    return app.screen


async def test_the_picker_lists_only_this_owners_threads_and_says_whose_at_80x24(opener: Opener) -> None:
    bob = await opener("bob")
    await _thread(bob, "t-bob", "bob's secret plan")
    alice = await opener("alice")
    await _thread(alice, "t-a1", "alice one")
    await _thread(alice, "t-a2", "alice two")
    app = make_app(fast_session(alice))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 2, what="alice's two threads")
        await wait_for_text(pilot, "threads of alice · 2")
        await wait_for(pilot, lambda: "t-a1" in screen_text(app) and "t-a2" in screen_text(app), what="rows drawn")
        text = screen_text(app)
        assert "t-bob" not in text and "secret" not in text
        assert {r.thread_id for r in app.threads_screen.rows} == {"t-a1", "t-a2"}
    # And bob sees only his.
    app = make_app(fast_session(await opener("bob")))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 1, what="bob's thread")
        await wait_for_text(pilot, "threads of bob · 1")
        await wait_for_text(pilot, "t-bob")
        assert "t-a1" not in screen_text(app)


async def test_an_empty_list_counts_only_the_threads_that_have_no_owner(opener: Opener) -> None:
    bob = await opener("bob")
    await _thread(bob, "t-bob", "bob's")
    unowned = await opener(UNOWNED)
    await _thread(unowned, "t-old-1", "from before owners")
    await _thread(unowned, "t-old-2", "from cubeloop")
    app = make_app(fast_session(await opener("alice")))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_text(pilot, "2 threads have no owner: open them with --unowned")
        text = screen_text(app)
        assert "threads of alice · 0" in text and "No threads yet" in text
        assert "t-bob" not in text and "3 threads" not in text and "1 thread" not in text
    # --unowned opens them; that list offers no hint about itself.
    app = make_app(fast_session(await opener(UNOWNED)))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 2, what="the unowned threads")
        await wait_for_text(pilot, "unowned threads · 2")
        assert "t-bob" not in screen_text(app)


async def test_the_empty_list_of_a_store_with_only_other_owners_threads_says_nothing_of_them(opener: Opener) -> None:
    await _thread(await opener("bob"), "t-bob", "bob's")
    app = make_app(fast_session(await opener("alice")))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_text(pilot, "No threads yet")
        await pilot.pause(0.3)  # the unowned count has come back by now
        text = screen_text(app)
        assert "no owner" not in text and "--unowned" not in text and "t-bob" not in text


async def _error_of_opening(store: Checkpointer, thread_id: str) -> tuple[str, str]:
    """The error screen's sentence and all it says when the app opens ``thread_id``."""
    app = make_app(fast_session(store), thread_id=thread_id)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ErrorScreen) and bool(app.screen.query("#error-sentence")),
            what="the error screen, composed",
        )
        assert isinstance(app.screen, ErrorScreen)
        return app.screen.sentence, widget_text(app.screen)


async def test_another_owners_thread_opens_exactly_as_a_missing_one(opener: Opener) -> None:
    missing_sentence, missing_screen = await _error_of_opening(await opener("alice"), "t-x")
    assert missing_sentence == str(thread_unavailable("t-x", "alice"))
    await _thread(await opener("bob"), "t-x", "bob's thread")
    foreign_sentence, foreign_screen = await _error_of_opening(await opener("alice"), "t-x")
    assert foreign_sentence == missing_sentence
    assert foreign_screen == missing_screen and missing_sentence in missing_screen
    assert "bob" not in foreign_screen


async def test_the_app_cannot_prompt_resume_command_or_delete_another_owners_thread(opener: Opener) -> None:
    bob = await opener("bob")
    await _thread(bob, "t-bob", "bob's thread")
    before = await bob.load("t-bob")
    app = make_app(fast_session(await opener("alice")))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for_text(pilot, "threads of alice · 0")
        session = app.session

        async def refusal(thread_id: str, attempt: Callable[[str], Awaitable[object]]) -> tuple[type, str]:
            with pytest.raises(CubepiError) as refused:
                await attempt(thread_id)
            return type(refused.value), str(refused.value).replace(thread_id, "ID")

        attempts: dict[str, Callable[[str], Awaitable[object]]] = {
            "delete": session.delete,
            "abort": lambda t: session.send(t, "abort"),
            "steer": lambda t: session.send(t, "steer", "turn left"),
            "follow-up": lambda t: session.send(t, "follow_up", "and then?"),
            "resume": session.resume,
        }
        for name, attempt in attempts.items():
            foreign = await refusal("t-bob", attempt)
            assert foreign == await refusal("t-none", attempt), name
            assert foreign == (ThreadNotFoundError, str(thread_unavailable("ID", "alice"))), name
        # A prompt appends: refused for bob's thread (a missing id would be a new thread).
        with pytest.raises(ThreadNotFoundError) as refused:
            await session.prompt("t-bob", "let me in")
        assert str(refused.value) == str(thread_unavailable("t-bob", "alice"))
    after = await bob.load("t-bob")
    assert before is not None and after is not None and after.messages == before.messages
    assert await bob.list_commands("t-bob") == []
    # Nothing alice tried made "t-none" hers either.
    assert await (await opener("alice")).load_meta("t-none") is None


def _cursor_to(app, thread_id: str) -> None:  # type: ignore[no-untyped-def]
    table = _picker(app).query_one(ThreadTable)
    table.move_cursor(row=table.get_row_index(thread_id))


async def test_D_deletes_the_thread_under_the_cursor_after_asking(opener: Opener) -> None:
    alice = await opener("alice")
    await _thread(alice, "t-keep", "keep me")
    await _thread(alice, "t-gone", "delete me")
    app = make_app(fast_session(alice))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.threads_screen.rows) == 2, what="two threads")
        _cursor_to(app, "t-gone")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert "t-gone" in squeezed_lines(screen_text(app)) and "cannot be undone" in squeezed_lines(screen_text(app))
        await pilot.press("n")  # no: nothing is deleted
        await wait_for(pilot, lambda: isinstance(app.screen, ThreadsScreen), what="back to the list")
        assert await alice.load("t-gone") is not None
        _cursor_to(app, "t-gone")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: [r.thread_id for r in app.threads_screen.rows] == ["t-keep"], what="one left")
        await wait_for_text(pilot, "threads of alice · 1")
        assert await alice.load("t-gone") is None and await alice.load_meta("t-gone") is None
        assert await alice.load("t-keep") is not None


async def test_D_is_refused_while_another_process_holds_the_threads_lease(opener: Opener) -> None:
    alice = await opener("alice")
    await _thread(alice, "t-busy", "work")
    now = time.time()
    lease = Lease("t-busy", "holder", 4242, "far-box", "r1", now, now, now + 120)
    await alice.acquire_lease(lease, is_stale=lambda _lease: True)
    app = make_app(fast_session(alice))
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: any(r.elsewhere for r in app.threads_screen.rows), what="running elsewhere")
        _cursor_to(app, "t-busy")
        await pilot.press("D")
        await wait_for(
            pilot,
            lambda: any(
                n.message.startswith(
                    "Thread 't-busy' was not deleted: process 4242 on far-box is running it (heartbeat "
                )
                for n in app._notifications
            ),
            what="the refusal",
        )
        assert not isinstance(app.screen, ConfirmModal)
        # The store refuses it too (a run that began after the list was drawn).
        with pytest.raises(CubepiError) as refused:
            await app.session.delete("t-busy")
        assert re.fullmatch(
            r"Thread 't-busy' was not deleted: process 4242 on far-box is running it \(heartbeat \d+ s ago\)\.",
            str(refused.value),
        ), str(refused.value)
        assert await alice.load("t-busy") is not None
