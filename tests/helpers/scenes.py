"""The README's screenshot scenes, one place each: ``python -m tests.screenshots`` saves them
as ``screenshots/NAME.svg`` and ``tests/tui/test_snapshots.py`` compares each with its
accepted snapshot, so the picture in the README and the test show the same screen.

A :class:`Scene` is a store written the way its programs write it (cubeloop's threads by the
real cubeloop, ours by our agent or store), an app on it (``make_app``, the one factory) and
the keys pressed from the app's first screen to the moment shown. Every scene is made
deterministic the same way:

* the wall clock is held at :data:`tests.helpers.frozen_clock.CLOCK` in the app and in the
  runner child (message times, "running since", lease ages, token counts);
* the app's host is :data:`APP_HOST`, the runner child's :data:`RUNNER_HOST` with pid
  :data:`RUNNER_PID`, a new thread's id :data:`NEW_THREAD_ID`;
* a run still going when shown (here or in the child) runs :func:`paused_demo_tools`: the
  demo's tools, same names, descriptions and arguments, each stopped at a known step
  (:data:`PAUSED_AT`) until the run is aborted, instead of a live percentage;
* the app is given its store as a path relative to its working directory (the scene's
  own), so the picker's title reads ``threads.sqlite`` on every machine;
* each waits for a known state (rows shown, tools at their step, a steer queued), then
  dismisses notifications (their lifetime is real seconds) and refreshes the footer's keys
  before the screen is taken. The time zone is the caller's to pin (``TZ=UTC``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from textual.pilot import Pilot

import tui.app
from core.agent import Agent
from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.demo import SYSTEM_PROMPT, demo_provider, demo_tools
from core.errors import ToolError
from core.leases import HOST_ID_ENV
from core.messages import AssistantMessage, TextContent, ToolCall, user_text
from core.owners import UNOWNED
from core.recovery import JOURNALED_KEY
from core.runner import AgentSpec
from core.tool_execution import call_job_key, result_to_json
from core.tools import AgentTool, AgentToolResult, ToolContext, tool
from tests.helpers.children import REPO_ROOT
from tests.helpers.cubeloop_threads import run_cubeloop
from tests.helpers.frozen_clock import CLOCK, frozen_clock
from tests.helpers.tui import open_from_picker, screen_text, wait_for
from tui.app import CubepiApp, make_app
from tui.cli import build_session
from tui.screens.answer import AnswerModal
from tui.screens.modals import ChangesModal, ConfirmModal, TextInputModal
from tui.screens.resume import ResumeModal
from tui.screens.thread import ThreadScreen
from tui.screens.threads import ThreadsScreen
from tui.session import Session
from tui.widgets.thread_table import ThreadTable
from tui.widgets.tool_call import ToolCallView

SIZE = (120, 36)
"""Columns and rows of the README's wide screenshots."""
SMALL = (80, 24)
"""Columns and rows of the owner screenshots: the smallest terminal the app is made for."""
SPEED = 50.0
"""Demo speed of the runs a scene finishes (the owners' threads): the same screens, sooner."""
TIMEOUT = 60.0
"""Seconds any wait of a scene may take (generous: a loaded 2-core machine, child processes)."""

APP_HOST = "laptop"
"""``CUBEPI_HOST_ID`` of the app's process in every scene."""
RUNNER_HOST = "build-7"
"""The host the runner child's lease names."""
RUNNER_PID = 48213
"""The pid the runner child's lease names (its real pid varies; another host's pid is only
shown, never probed)."""
NEW_THREAD_ID = "20261129-121320-5eed"
"""The id of the thread the ``thread`` scene starts (``tui.app.new_thread_id`` at CLOCK)."""

NEW_PROMPT = "Forecast next quarter's sales by region"
RUNNER_THREAD = "nightly-report"
RUNNER_PROMPT = "Write the nightly sales report"
STEER = "Compare with the same night last year"

PAUSED_AT = {"fetch_dataset": (0.45, "downloading shard 4/8"), "train_model": (0.5, "epoch 3/5")}
"""Where each paused tool stops: (progress 0..1, status text), as the demo tool reports it
at that step."""


class PausedTool(AgentTool):
    """``inner`` (a demo tool) as the model and the store see it (name, description,
    arguments, idempotence, job key), whose call reports :data:`PAUSED_AT` and waits for
    the run's abort, then fails as the demo tool does ("Stopped: the run was aborted.")."""

    def __init__(self, inner: AgentTool) -> None:
        self.name = inner.name
        self.description = inner.description
        self.parameters = inner.parameters
        self.idempotent = inner.idempotent
        self.job_key_from = inner.job_key_from

    async def invoke(self, ctx: ToolContext, params: BaseModel) -> AgentToolResult:
        """Report the paused step, then wait for the abort; raises ``ToolError`` then."""
        progress, text = PAUSED_AT.get(self.name, (0.5, "halfway"))
        ctx.report(progress=progress, text=text)
        await ctx.signal.wait()
        raise ToolError("Stopped: the run was aborted.")


def paused_demo_tools() -> list[AgentTool]:
    """The demo's tools (``core.demo.demo_tools``), each a :class:`PausedTool`."""
    return [PausedTool(t) for t in demo_tools()]


def paused_demo_agent() -> AgentSpec:
    """The runner child's ``--agent``: the demo model (at :data:`SPEED`) with the paused tools."""
    return AgentSpec(demo_provider(speed=SPEED), paused_demo_tools(), SYSTEM_PROMPT)


@tool
async def notify_team(message: str) -> str:
    """Post a message to the team channel (not idempotent: each call posts again)."""
    return f"Posted {message!r} to the team."


class Stage:
    """Where one scene is played: a work directory, the cubeloop crash-point database to
    copy (``crashpoints``, written by ``make_crashpoint_db``), the runner children started
    (killed by :meth:`close`), and the process-wide settings held for the scene (the frozen
    clock, :data:`APP_HOST`, :data:`NEW_THREAD_ID`, ``work`` as the working directory),
    restored by :meth:`close`. Not reentrant: one scene at a time per process."""

    def __init__(self, work: Path, crashpoints: Path) -> None:
        self.work = work
        self.crashpoints = crashpoints
        self.db = work / "threads.sqlite"
        self.location = Path(self.db.name)
        """:attr:`db` as the app is given it: relative to ``work``, the app's working directory
        during the scene, so the picker's title shows the same path on every machine."""
        self.children: list[subprocess.Popen[bytes]] = []
        self._restore: list[Callable[[], None]] = []

    def __enter__(self) -> Stage:
        clock = frozen_clock()
        clock.__enter__()
        self._restore.append(lambda: clock.__exit__(None, None, None))
        old_host = os.environ.get(HOST_ID_ENV)
        os.environ[HOST_ID_ENV] = APP_HOST
        self._restore.append(
            lambda: (
                os.environ.pop(HOST_ID_ENV, None) if old_host is None else os.environ.update({HOST_ID_ENV: old_host})
            )
        )
        cwd = Path.cwd()
        os.chdir(self.work)
        self._restore.append(lambda: os.chdir(cwd))
        new_thread_id = tui.app.new_thread_id
        tui.app.new_thread_id = lambda: NEW_THREAD_ID  # type: ignore[assignment]
        self._restore.append(lambda: setattr(tui.app, "new_thread_id", new_thread_id))
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every child still running, then restore what :meth:`__enter__` changed."""
        for child in self.children:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
        self.children.clear()
        while self._restore:
            self._restore.pop()()

    def cubeloop_db(self) -> Path:
        """:attr:`db`, a fresh copy of the crash-point database plus ``which-file`` (a run
        that asked a human question and detached), both written by the real cubeloop."""
        shutil.copyfile(self.crashpoints, self.db)
        self.db.chmod(0o644)
        run_cubeloop(self.db, "ask_and_detach", "which-file", arg="run-ask-1")
        return self.db

    def start_runner(self) -> subprocess.Popen[bytes]:
        """A headless runner child running :data:`RUNNER_THREAD` of :attr:`db` (unowned)
        with :func:`paused_demo_agent`, as host :data:`RUNNER_HOST` (``tests.helpers.scene_runner``)."""
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.scene_runner", str(self.db), RUNNER_THREAD, RUNNER_PROMPT],
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.children.append(child)
        return child


def unowned_session(stage: Stage, *extra: AgentTool) -> Session:
    """The app's session on the stage's file, unowned (cubeloop records no owner), with the
    paused demo tools and ``extra``."""
    return build_session(
        stage.location, demo=True, demo_speed=SPEED, owner=UNOWNED, tools=[*paused_demo_tools(), *extra]
    )


@dataclass(frozen=True)
class Scene:
    """One screenshot: ``name`` (``screenshots/NAME.svg``), terminal ``size`` (columns,
    rows), ``prepare(stage)`` writing the stores and returning the session, ``drive(pilot,
    stage)`` pressing keys from the app's first screen to the moment shown."""

    name: str
    size: tuple[int, int]
    prepare: Callable[[Stage], Awaitable[Session]]
    drive: Callable[[Pilot[Any], Stage], Awaitable[None]]

    async def app(self, stage: Stage) -> CubepiApp:
        """The app of this scene on ``stage``, not started."""
        return make_app(await self.prepare(stage))


async def _until(pilot: Pilot[Any], predicate: Callable[[], bool], what: str) -> None:
    await wait_for(pilot, predicate, TIMEOUT, what)


async def _settled(pilot: Pilot[Any]) -> None:
    """The moment shown: notifications dismissed (each lives a few seconds of real time, so
    whether one is still up would depend on the machine's speed), the footer's keys made
    current, then the screen left to settle."""
    pilot.app.clear_notifications()
    # The footer shows the keys of the widget focused when it last recomposed: the picker's
    # table takes the focus when its rows arrive, and whether the footer had caught up by
    # then differed between runs ("⏎ Open" shown or not). Asking now shows the keys of now.
    pilot.app.screen.refresh_bindings()
    # Textual's progress bar rounds a value down to a half cell of its width only when it
    # is set after the bar's first layout (``Bar._validate_percentage`` reads ``size.width``,
    # 0 before it): 45 % of 32 cells drew 14.5 cells or 14 as the report came before or after
    # that layout. Setting each bar's value again now rounds them all as a laid-out bar does.
    for bar in pilot.app.screen.query("Bar"):
        bar.percentage = bar.percentage  # type: ignore[attr-defined]
    # Then until two looks 0.2 s apart see the same screen (a transcript still being laid
    # out on a loaded machine would otherwise be taken half drawn).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    before = None
    while True:
        await pilot.pause(0.2)
        now = screen_text(pilot.app)
        if now == before:
            return
        if loop.time() > deadline:
            raise AssertionError(f"the screen kept changing for {TIMEOUT:.0f} s:\n{now}")
        before = now


def _paused_tools_shown(app: CubepiApp) -> bool:
    """Whether the thread screen on top shows both first demo tools running at their paused step."""
    if not isinstance(app.screen, ThreadScreen):
        return False
    at = {v.tool_name: v.progress for v in app.screen.query(ToolCallView) if v.status == "running"}
    return all(at.get(name) == progress for name, (progress, _text) in PAUSED_AT.items())


# --- the cubeloop scenes ----------------------------------------------------------------------


async def _cubeloop(stage: Stage) -> Session:
    stage.cubeloop_db()
    return unowned_session(stage)


async def _crash(pilot: Pilot[Any], stage: Stage) -> None:
    await open_from_picker(pilot, "crash-mid-tool")
    await _settled(pilot)


async def _waiting(pilot: Pilot[Any], stage: Stage) -> None:
    await open_from_picker(pilot, "which-file")
    await _settled(pilot)


async def _cubeloop_approval(stage: Stage) -> Session:
    """The cubeloop file plus ``drop-config``: cubeloop's approval policy stopped a
    ``delete_file`` call for a person's approval, then its host detached."""
    run_cubeloop(stage.cubeloop_db(), "approve_and_detach", "drop-config", arg="run-del-1")
    return unowned_session(stage)


async def _answer(pilot: Pilot[Any], stage: Stage) -> None:
    """The answer dialog of ``drop-config``'s approval: d chose deny, a reason typed."""
    app = pilot.app
    await open_from_picker(pilot, "drop-config")
    await pilot.press("y")
    await _until(pilot, lambda: isinstance(app.screen, AnswerModal), "the answer dialog")
    await pilot.press("d")
    await _until(pilot, lambda: app.screen.query_one("#reason").display, "the reason field")  # type: ignore[attr-defined]
    app.screen.query_one("#reason").value = "Not on a production host"  # type: ignore[attr-defined]
    await _settled(pilot)


async def _thread(pilot: Pilot[Any], stage: Stage) -> None:
    """A new thread on cubeloop's file: the first write asks to upgrade it (y), then the
    demo run streams its reply and its two tools stop at their paused step."""
    app = pilot.app
    await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen) and bool(app.screen.rows), "the picker")
    await pilot.press("n")
    await _until(pilot, lambda: isinstance(app.screen, TextInputModal), "the prompt dialog")
    app.screen.query_one("Input").value = NEW_PROMPT  # type: ignore[attr-defined]
    await pilot.press("enter")
    await _until(pilot, lambda: isinstance(app.screen, ConfirmModal), "the upgrade question")
    await pilot.press("y")
    await _until(pilot, lambda: _paused_tools_shown(app), "both tools at their paused step")  # type: ignore[arg-type]
    await _settled(pilot)


async def _write_crashed_elsewhere(db: Path) -> None:
    """``weekly-digest``: its runner on host ``build-3`` stopped mid-tool 40 s ago (its lease expired)."""
    store = await SQLiteCheckpointer.open(db, create=False, owner=UNOWNED)
    try:
        await store.claim_run("weekly-digest", "run-w1")
        call = ToolCall(id="call_fetch", name="fetch_dataset", arguments={"name": "tickets", "rows": 900})
        reply = AssistantMessage(
            content=[TextContent(text="Fetching this week's tickets."), call],
            stop_reason="tool_use",
            run_id="run-w1",
            model_id="demo",
        )
        await store.append("weekly-digest", [user_text("Summarise this week's tickets", run_id="run-w1"), reply])
        now = CLOCK
        lease = Lease("weekly-digest", uuid.uuid4().hex, 31337, "build-3", "run-w1", now - 300, now - 55, now - 40)
        await store.acquire_lease(lease, is_stale=lambda _current: True)
    finally:
        await store.close()


async def _picker(pilot: Pilot[Any], stage: Stage) -> None:
    """After :func:`_thread` (a run here): a crashed run on ``build-3`` and a runner child on
    :data:`RUNNER_HOST`; the picker with its cursor on the first row."""
    app = pilot.app
    await _thread(pilot, stage)
    await pilot.press("q")
    await _write_crashed_elsewhere(stage.db)
    stage.start_runner()
    await _until(
        pilot,
        lambda: (
            isinstance(app.screen, ThreadsScreen)
            and {r.thread_id for r in app.screen.rows if r.elsewhere} == {RUNNER_THREAD}
            # The child's prompt and its reply calling the (paused) tools: nothing more comes.
            and any(r.thread_id == RUNNER_THREAD and r.message_count == 2 for r in app.screen.rows)
            and any(r.running for r in app.screen.rows)
            and any(r.thread_id == "weekly-digest" for r in app.screen.rows)
        ),
        "the picker with the runs here and elsewhere",
    )
    table = app.screen.query_one(ThreadTable)
    await _until(pilot, lambda: table.settled, "the rows made")
    table.move_cursor(row=0)
    await _settled(pilot)


async def _elsewhere(pilot: Pilot[Any], stage: Stage) -> None:
    """After :func:`_picker`: the child's thread followed, its tools at their paused step,
    a steer sent to it, queued until its next turn boundary (still pending, so editable)."""
    app = pilot.app
    await _picker(pilot, stage)
    await open_from_picker(pilot, RUNNER_THREAD)
    screen = app.screen
    assert isinstance(screen, ThreadScreen)
    await _until(pilot, lambda: _paused_tools_shown(app), "the child's tools at their paused step")  # type: ignore[arg-type]
    await pilot.press("s")
    await _until(pilot, lambda: isinstance(app.screen, TextInputModal), "the steer dialog")
    app.screen.query_one("Input").value = STEER  # type: ignore[attr-defined]
    await pilot.press("enter")
    await _until(pilot, lambda: screen.commands_bar.status_of(1) == "pending", "the steer listed pending")
    await _settled(pilot)


# --- resume -----------------------------------------------------------------------------------


async def _killed_run(stage: Stage) -> Session:
    """``killed-mid-tool``: our runner was killed with three calls in flight (one idempotent
    job started, one done, one not idempotent), as our agent writes it."""
    tools = {t.name: t for t in demo_tools()}
    fetch = ToolCall(
        id="call_fetch", name="fetch_dataset", arguments={"name": "demo-sales", "rows": 50_000, "request": 1}
    )
    train = ToolCall(id="call_train", name="train_model", arguments={"model": "baseline", "epochs": 5, "request": 1})
    post = ToolCall(id="call_post", name="notify_team", arguments={"message": "baseline trained"})
    store = await SQLiteCheckpointer.open(stage.db, create=True, owner=UNOWNED)
    try:
        await store.claim_run("killed-mid-tool", "run-1")
        reply = AssistantMessage(
            content=[
                TextContent(text="Fetching and training in parallel; I will tell the team when done."),
                fetch,
                train,
                post,
            ],
            stop_reason="tool_use",
            run_id="run-1",
            model_id="demo",
            metadata={JOURNALED_KEY: True},
        )
        await store.append("killed-mid-tool", [user_text("Train a baseline and tell the team", run_id="run-1"), reply])
        for call in (fetch, train):
            key = call_job_key(tools[call.name], call)
            assert key is not None
            await store.record_tool_event(
                "killed-mid-tool", call.id, "start", tool_name=call.name, run_id="run-1", job_key=key, at=CLOCK - 120
            )
            await store.job_begin("killed-mid-tool", key, call.id)
        train_key = call_job_key(tools["train_model"], train)
        assert train_key is not None
        result = AgentToolResult("Trained 'baseline' for 5 epochs; validation accuracy 0.87, loss 0.31.")
        await store.job_finish("killed-mid-tool", train_key, "done", result_to_json(result))
    finally:
        await store.close()
    return unowned_session(stage, notify_team)


async def _resume(pilot: Pilot[Any], stage: Stage) -> None:
    app = pilot.app
    await open_from_picker(pilot, "killed-mid-tool")
    await pilot.press("r")
    await _until(pilot, lambda: isinstance(app.screen, ResumeModal), "the resume dialog")
    await _settled(pilot)


# --- owners -----------------------------------------------------------------------------------


async def _demo_thread(db: Path, owner: str, thread_id: str, prompt: str, workflow: str | None = None) -> None:
    """One finished demo run of ``thread_id`` by ``owner`` (at :data:`SPEED`), as the app writes it."""
    store = await SQLiteCheckpointer.open(db, create=True, owner=owner)
    try:
        agent = Agent(
            demo_provider(speed=SPEED),
            store,
            thread_id,
            tools=demo_tools(speed=SPEED),
            system_prompt=SYSTEM_PROMPT,
            workflow=workflow,
        )
        assert await agent.prompt(prompt) == "completed", agent.state.error
    finally:
        await store.close()


async def _owners_store(stage: Stage) -> Session:
    """alice's view (workflow 2) of a store shared with bob and an unowned old thread; her
    ``quarterly-review`` was run with workflow 1."""
    db = stage.db
    await _demo_thread(db, "alice", "sales-forecast", "Forecast next quarter's sales by region", "2")
    await _demo_thread(db, "bob", "bobs-budget", "Draft next year's budget", "2")
    await _demo_thread(db, UNOWNED, "old-notes", "Summarise the meeting notes")
    await _demo_thread(db, "alice", "churn-report", "Why did churn rise in March?", "2")
    await _demo_thread(db, "alice", "quarterly-review", "Review the quarter's numbers", "1")
    return build_session(stage.location, demo=True, demo_speed=SPEED, owner="alice", workflow="2")


async def _owners(pilot: Pilot[Any], stage: Stage) -> None:
    app = pilot.app
    await _until(pilot, lambda: isinstance(app.screen, ThreadsScreen) and len(app.screen.rows) == 3, "alice's 3 rows")
    table = app.screen.query_one(ThreadTable)
    await _until(pilot, lambda: table.settled, "the rows made")
    await _settled(pilot)


async def _changes(pilot: Pilot[Any], stage: Stage) -> None:
    """A new prompt on ``quarterly-review`` (workflow 1, the app's is 2): what changed."""
    app = pilot.app
    await _owners(pilot, stage)
    await open_from_picker(pilot, "quarterly-review")
    await pilot.press("n")
    await _until(pilot, lambda: isinstance(app.screen, TextInputModal), "the prompt dialog")
    app.screen.query_one("Input").value = "And compared with last year?"  # type: ignore[attr-defined]
    await pilot.press("enter")
    await _until(pilot, lambda: isinstance(app.screen, ChangesModal), "the changes dialog")
    await _settled(pilot)


async def _owner_line(pilot: Pilot[Any], stage: Stage) -> None:
    """After :func:`_changes`: ``a`` accepts; the run finishes and the owner line shows the
    override recorded."""
    app = pilot.app
    await _changes(pilot, stage)
    await pilot.press("a")
    await _until(
        pilot,
        lambda: (
            isinstance(app.screen, ThreadScreen)
            and not app.screen.running
            and app.screen.facts is not None
            and bool(app.screen.facts.meta and app.screen.facts.meta.overrides)
        ),
        "the run finished with the override recorded",
    )
    await _settled(pilot)


SCENES: dict[str, Scene] = {
    s.name: s
    for s in (
        Scene("crash", SIZE, _cubeloop, _crash),
        Scene("waiting", SIZE, _cubeloop, _waiting),
        Scene("answer", SIZE, _cubeloop_approval, _answer),
        Scene("thread", SIZE, _cubeloop, _thread),
        Scene("picker", SIZE, _cubeloop, _picker),
        Scene("elsewhere", SIZE, _cubeloop, _elsewhere),
        Scene("resume", SIZE, _killed_run, _resume),
        Scene("owners", SMALL, _owners_store, _owners),
        Scene("changes", SMALL, _owners_store, _changes),
        Scene("owner-line", SMALL, _owners_store, _owner_line),
    )
}
"""Every README screenshot's scene, by name (the SVG's file stem)."""


@contextmanager
def staged(work: Path, crashpoints: Path) -> Iterator[Stage]:
    """A :class:`Stage` in ``work`` (created) for one scene, closed on exit."""
    work.mkdir(parents=True, exist_ok=True)
    with Stage(work, crashpoints) as stage:
        yield stage
