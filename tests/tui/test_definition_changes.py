"""A thread written by another definition of the agent, in the app: the thread view shows
owner, workflow and definition state; a new prompt or a resume shows what changed, and
offers the explicit override (``a``, recorded in the thread) or cancel (nothing runs,
nothing typed is lost)."""

from __future__ import annotations

from textual.widgets import Input, Static

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.providers.base import error_reply
from core.providers.faux import FauxProvider
from tests.helpers import owner_agents
from tests.helpers.tui import fast_session, squeezed_lines, wait_for, widget_text
from tui.app import make_app
from tui.screens.modals import ChangesModal, TextInputModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.session import Session

CHANGE = "tool lookup: parameters changed"


def _provider() -> FauxProvider:
    return FauxProvider(fallback=lambda request: owner_agents.REPLY)


async def _written_by_v1(store: MemoryCheckpointer, thread_id: str, provider: FauxProvider | None = None) -> str:
    """Run ``thread_id`` once with the first definition (``lookup(query)``); its outcome."""
    spec = owner_agents.v1()
    agent = Agent(provider or _provider(), store, thread_id, tools=spec.tools, system_prompt=spec.system_prompt)
    return await agent.prompt("hello")


def _v2_session(store: MemoryCheckpointer) -> Session:
    """The app's session with the second definition (``lookup(query, limit)``)."""
    spec = owner_agents.v2()
    return fast_session(store, tools=spec.tools, system_prompt=spec.system_prompt, make_provider=_provider)


def _facts(app) -> str:  # type: ignore[no-untyped-def]
    return " ".join(str(w.content) for w in app.screen.query("#thread-facts").results(Static))


async def _open(pilot, app, thread_id: str) -> ThreadScreen:  # type: ignore[no-untyped-def]
    await wait_for(
        pilot,
        lambda: isinstance(app.screen, ThreadScreen) and app.screen.loaded and app.screen.facts is not None,
        what=f"thread {thread_id} and its facts",
    )
    return app.screen


async def test_a_new_prompt_on_a_changed_definition_asks_then_cancel_keeps_the_text_and_a_records_the_override() -> (
    None
):
    store = MemoryCheckpointer("alice")
    assert await _written_by_v1(store, "t-fp") == "completed"
    before = await store.load("t-fp")
    assert before is not None and len(before.messages) == 2
    app = make_app(_v2_session(store), thread_id="t-fp")
    async with app.run_test(size=(120, 36)) as pilot:
        await _open(pilot, app, "t-fp")
        await wait_for(pilot, lambda: CHANGE in _facts(app), what="the facts line")
        facts = _facts(app)
        assert "owner alice" in facts and "workflow none" in facts and f"definition changed: {CHANGE}" in facts

        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the prompt dialog")
        app.screen.query_one(Input).value = "again, please"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChangesModal), what="the changes dialog")
        said = widget_text(app.screen)
        assert CHANGE in said and "recorded in the thread" in said and "t-fp" in said

        await pilot.press("escape")  # cancel: nothing runs, the prompt is offered again as typed
        await wait_for(pilot, lambda: isinstance(app.screen, TextInputModal), what="the prompt offered again")
        assert app.screen.query_one(Input).value == "again, please"
        assert "changes were not accepted" in squeezed_lines(widget_text(app.screen))
        unchanged = await store.load("t-fp")
        assert unchanged is not None and unchanged.messages == before.messages
        meta = await store.load_meta("t-fp")
        assert meta is not None and meta.overrides == ()

        await pilot.press("enter")  # sent again: asked again
        await wait_for(pilot, lambda: isinstance(app.screen, ChangesModal), what="the changes dialog again")
        await pilot.press("a")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ThreadScreen) and not app.screen.running and "override" in _facts(app),
            what="the run and the override shown",
        )
        after = await store.load("t-fp")
        assert after is not None and [m.text for m in after.messages[2:]] == ["again, please", owner_agents.REPLY]
        meta = await store.load_meta("t-fp")
        assert meta is not None and [o.changes for o in meta.overrides] == [(CHANGE,)]
        assert meta.overrides[0].owner == "alice"
        facts = _facts(app)
        assert "definition unchanged" in facts and f"by alice: {CHANGE}" in facts


async def test_resume_on_a_changed_definition_asks_then_cancel_runs_nothing_and_a_resumes() -> None:
    store = MemoryCheckpointer("alice")
    failing = FauxProvider([lambda request: error_reply(failing, "The model is overloaded.")])
    assert await _written_by_v1(store, "t-fr", failing) == "failed"
    before = await store.load("t-fr")
    assert before is not None
    app = make_app(_v2_session(store), thread_id="t-fr")
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await _open(pilot, app, "t-fr")

        async def resume_until_asked() -> None:
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ResumeModal), what="the resume plan")
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, ChangesModal), what="the changes dialog")
            assert CHANGE in widget_text(app.screen) and "resume" in widget_text(app.screen)

        await resume_until_asked()
        await pilot.press("c")
        await wait_for(pilot, lambda: app.screen is screen and not screen.running, what="back, nothing ran")
        unchanged = await store.load("t-fr")
        assert unchanged is not None and unchanged.messages == before.messages and unchanged.runs == before.runs

        await resume_until_asked()
        await pilot.press("a")
        await wait_for(
            pilot,
            lambda: app.screen is screen and not screen.running and "override" in _facts(app),
            what="the resumed run and the override shown",
        )
        after = await store.load("t-fr")
        assert after is not None and after.messages[-1].text == owner_agents.REPLY
        meta = await store.load_meta("t-fr")
        assert meta is not None and [o.changes for o in meta.overrides] == [(CHANGE,)]


async def test_the_first_run_of_a_new_thread_shows_its_definition_recorded_while_it_runs() -> None:
    """A new thread's first run records its fingerprints before it starts: the owner line says
    "definition unchanged" during that run, not "definition not recorded" until it ends."""
    import asyncio

    from tests.helpers.screens import running_tool
    from tests.helpers.tui import send_via_dialog

    store = MemoryCheckpointer("alice")
    session = fast_session(store)
    trainer = next(t for t in session.config.tools if t.name == "train_model")
    invoke, gate = trainer.invoke, asyncio.Event()

    async def held(ctx, params):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await invoke(ctx, params)

    trainer.invoke = held  # type: ignore[method-assign]
    app = make_app(session)
    async with app.run_test(size=(120, 36)) as pilot:
        await send_via_dialog(pilot, "n", "train something")
        await wait_for(pilot, lambda: running_tool(app), timeout=60, what="a tool running")
        screen = app.screen
        assert isinstance(screen, ThreadScreen) and screen.running
        meta = await store.load_meta(screen.thread_id)
        assert meta is not None and meta.fingerprints is not None  # saved before the run began
        await wait_for(pilot, lambda: "definition unchanged" in _facts(app), what="the owner line, during the run")
        assert screen.running and "not recorded" not in _facts(app)
        gate.set()
        await wait_for(pilot, lambda: not screen.running, timeout=60, what="the run finished")
        assert "definition unchanged" in _facts(app)
