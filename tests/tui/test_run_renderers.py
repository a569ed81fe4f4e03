"""The two renderers of a thread's run, fed by hand: LocalRun draws a run here from its
agent's events, FollowedRun a run elsewhere from a follower's changes, both into a
transcript and a status bar (no store, no agent, no follower)."""

from __future__ import annotations

import re
import time

from textual.app import App, ComposeResult
from textual.screen import Screen

from core.checkpoint.base import CorruptRow
from core.events import (
    AgentEnd,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RetryWait,
    TextDelta,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.follow import ThreadChange, ThreadModel
from core.lease_status import LeaseState, LeaseView
from core.live import LiveRetry, LiveTool
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, Usage, user_text
from tests.helpers.tui import screen_text
from tui.screens.followed_run import FollowedRun
from tui.screens.local_run import LocalRun
from tui.screens.shown_run import RetryCountdown
from tui.widgets.status_bar import StatusBar
from tui.widgets.tool_call import ToolCallView
from tui.widgets.transcript import Transcript

SIZE = (120, 40)
WAIT = RetryWait(seconds=30, reason="rate limited", attempt=1, max_attempts=5)


class _Surface(Screen[None]):
    """A transcript and a status bar, as a thread screen lays them out."""

    def compose(self) -> ComposeResult:
        yield Transcript()
        yield StatusBar()

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def status_bar(self) -> StatusBar:
        return self.query_one(StatusBar)


class _Host(App[None]):
    def on_mount(self) -> None:
        self.push_screen(_Surface())


def _reply(*blocks: object, usage: Usage | None = None) -> AssistantMessage:
    return AssistantMessage(content=list(blocks), model_id="faux-1", usage=usage or Usage())  # type: ignore[arg-type]


def _held_texts(transcript: Transcript) -> list[str]:
    """The text of each entry the transcript holds (every one a message: no row is unreadable here)."""
    texts = []
    for entry in transcript.held:
        assert not isinstance(entry, CorruptRow)
        texts.append(entry.text)
    return texts


async def test_a_run_here_streams_its_reply_then_shows_it_once_with_its_tool_and_usage() -> None:
    app = _Host()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        surface = app.screen
        assert isinstance(surface, _Surface)
        await surface.transcript.show([])
        retry = RetryCountdown(surface)
        flushes: list[None] = []

        async def flush_screen() -> None:
            flushes.append(None)
            await run.flush()

        run = LocalRun(surface, retry, flush_screen)
        assert not run.dirty
        await run.apply(MessageEnd(user_text("Count the files in /data")))
        await run.apply(MessageStart(_reply()))
        streamed = _reply(TextContent(text="Let me look."))
        await run.apply(MessageUpdate(streamed, TextDelta(0, "Let me look.")))
        assert run.dirty and surface.transcript.live is None  # noted, not drawn per delta
        await run.flush()
        await pilot.pause()
        assert surface.transcript.live is not None and "Let me look." in screen_text(app)

        await run.apply(MessageUpdate(streamed, WAIT))
        await pilot.pause()
        assert surface.status_bar.retry == "rate limited, retrying in 30 s (attempt 2 of 5)"
        await run.apply(MessageUpdate(streamed, TextDelta(0, "")))
        assert surface.status_bar.retry == "" and not retry.shown  # the next attempt streams

        call = ToolCall(id="c1", name="list_files", arguments={"path": "/data"})
        final = _reply(TextContent(text="Let me look."), call, usage=Usage(input_tokens=10, output_tokens=5))
        before = len(flushes)
        await run.apply(MessageEnd(final))
        assert len(flushes) == before + 1  # buffered text is drawn before the reply is placed
        assert surface.transcript.live is None
        assert [type(e).__name__ for e in surface.transcript.held] == ["UserMessage", "AssistantMessage"]
        bar = surface.status_bar
        assert (bar.input_tokens, bar.output_tokens) == (10, 5)

        await run.apply(ToolExecutionStart("c1", "list_files"))
        view = surface.transcript.tool_views["c1"]
        assert view.status == "running"
        await run.apply(ToolExecutionUpdate("c1", "list_files", progress=0.5, text="reading /data"))
        assert run.dirty and view.progress is None
        await run.flush()
        assert (view.progress, view.status_text) == (0.5, "reading /data")
        assert not run.dirty
        result = ToolResultMessage(tool_call_id="c1", tool_name="list_files", content=[TextContent(text="a.txt")])
        await run.apply(ToolExecutionUpdate("c1", "list_files", progress=0.9))
        await run.apply(ToolExecutionEnd("c1", "list_files", result))
        assert view.status == "ok" and not run.dirty  # progress after its end is never drawn

        await run.apply(MessageUpdate(streamed, WAIT))
        await run.apply(AgentEnd("r1", "aborted"))
        assert (bar.run_state, bar.retry) == ("aborted", "")
        await pilot.pause()
        assert len(list(surface.transcript.query(ToolCallView))) == 1


def _model(*messages: object, live: bool = True) -> ThreadModel:
    state = LeaseState.RUNNING_ELSEWHERE if live else LeaseState.ENDED
    return ThreadModel(thread_id="t1", messages=list(messages), lease_view=LeaseView(state))  # type: ignore[arg-type]


async def test_a_followed_run_shows_each_persisted_message_once_and_streams_only_the_next_one() -> None:
    app = _Host()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        surface = app.screen
        assert isinstance(surface, _Surface)
        await surface.transcript.show([])
        prompt = user_text("Count the files in /data")
        first = _reply(TextContent(text="Looking now."), usage=Usage(input_tokens=7, output_tokens=3))
        model = _model(prompt, first)
        model.message_ids = [1, 2]
        followed = FollowedRun(surface, RetryCountdown(surface), model, 0)
        await followed.apply(ThreadChange(model, reset=True, added=(prompt, first)))
        bar = surface.status_bar
        assert followed.shown == 2 and (bar.input_tokens, bar.output_tokens) == (7, 3)
        assert _held_texts(surface.transcript) == ["Count the files in /data", "Looking now."]

        # A partial for a later index than the next one is not drawn (it would come out of order).
        model.partial, model.partial_index = _reply(TextContent(text="Too early.")), 3
        await followed.apply(ThreadChange(model, partial_reset=True))
        await followed.flush()
        assert surface.transcript.live is None
        model.partial, model.partial_index = _reply(TextContent(text="There are 2 files.")), 2
        await followed.apply(ThreadChange(model, partial_reset=True))
        assert followed.dirty
        await followed.flush()
        await pilot.pause()
        assert not followed.dirty and "There are 2 files." in screen_text(app)

        model.retry = LiveRetry(WAIT, until=time.time() + 200, index=2)
        await followed.apply(ThreadChange(model, retry=True))
        shown = re.fullmatch(r"rate limited, retrying in (\d+) s \(attempt 2 of 5\)", bar.retry)
        assert shown is not None and 190 <= int(shown[1]) <= 200  # the runner's end, not 30 s from now
        model.retry = None
        await followed.apply(ThreadChange(model, retry=True))
        assert bar.retry == ""

        # The reply persisted: the live view becomes it, shown once, and its usage counted.
        second = _reply(TextContent(text="There are 2 files."), usage=Usage(input_tokens=9, output_tokens=4))
        model.messages.append(second)
        model.partial, model.partial_index = None, None
        await followed.apply(ThreadChange(model, added=(second,), partial_reset=True))
        assert surface.transcript.live is None and followed.shown == 3
        assert _held_texts(surface.transcript).count("There are 2 files.") == 1
        assert (bar.input_tokens, bar.output_tokens) == (16, 7)

        # A tool running elsewhere moves its call's progress on the next flush.
        call = ToolCall(id="c1", name="list_files", arguments={})
        third = _reply(call)
        model.messages.append(third)
        await followed.apply(ThreadChange(model, added=(third,)))
        model.running_tools = {"c1": LiveTool("c1", "list_files", started_at=time.time(), progress=0.25)}
        await followed.apply(ThreadChange(model, tools=True))
        await followed.flush()
        view = surface.transcript.tool_views["c1"]
        assert (view.status, view.progress) == ("running", 0.25)

        # The runner is gone with a half-streamed reply: it will never be saved, so it goes.
        model.partial, model.partial_index = _reply(TextContent(text="Half a rep")), 4
        await followed.apply(ThreadChange(model, partial_reset=True))
        await followed.flush()
        assert surface.transcript.live is not None
        model.partial, model.lease_view = None, LeaseView(LeaseState.ENDED)
        await followed.apply(ThreadChange(model, partial_reset=True, lease=True))
        assert surface.transcript.live is None and followed.shown == 4
