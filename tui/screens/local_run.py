"""LocalRun: draws a run of this process, from its agent's events, into a thread screen.

The agent's listener posts each :data:`~core.events.AgentEvent` to the screen
(:class:`~tui.messages.AgentEventReceived`); the screen hands it to :meth:`LocalRun.apply`,
which draws what it means for the transcript and the status bar: finished messages at
once, a tool call's start and end at once. Stream deltas and tool progress are only noted
(:attr:`LocalRun.dirty`) and drawn by :meth:`LocalRun.flush` on the screen's flush timer,
so a fast stream costs at most one redraw per block per tick. What an event means for the
screen's state (running, the request it waits on) is the screen's to decide
(:class:`~tui.screens.thread_view.ThreadView`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from core.events import (
    AgentEnd,
    AgentEvent,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    RetryWait,
    ToolExecutionEnd,
    ToolExecutionStart,
    ToolExecutionUpdate,
)
from core.messages import AssistantMessage
from tui.screens.shown_run import RetryCountdown, RunSurface


class LocalRun:
    """Draws one screen's runs here into ``surface``; see the module docstring.

    ``countdown`` is the screen's retry countdown (shared with the run followed). ``flush_screen``
    draws everything the screen has buffered (this run's stream and progress among it, see
    :meth:`flush`), the way its flush timer does; it is awaited before a message or a
    tool call is drawn, so buffered text never lands after what follows it.
    """

    def __init__(
        self, surface: RunSurface, countdown: RetryCountdown, flush_screen: Callable[[], Awaitable[None]]
    ) -> None:
        self._surface = surface
        self._countdown = countdown
        self._flush_screen = flush_screen
        self._partial: AssistantMessage | None = None  # the live reply, redrawn on the next flush
        self._progress: dict[str, tuple[float | None, str | None]] = {}  # call id -> (fraction 0..1, text)

    @property
    def dirty(self) -> bool:
        """Whether the streamed reply or a tool's progress changed since the last flush."""
        return self._partial is not None or bool(self._progress)

    async def apply(self, event: AgentEvent) -> None:
        """Draw ``event`` of the run here (events of other kinds draw nothing)."""
        transcript = self._surface.transcript
        if isinstance(event, MessageUpdate):
            self._partial = event.message
            if isinstance(event.delta, RetryWait):
                self._countdown.show(event.delta)
            elif self._countdown.shown:
                self._countdown.clear()  # the next attempt streams
        elif isinstance(event, ToolExecutionUpdate):
            self._progress[event.tool_call_id] = (event.progress, event.text)
        elif isinstance(event, MessageStart):
            if isinstance(event.message, AssistantMessage):
                self._partial = event.message
        elif isinstance(event, MessageEnd):
            await self._flush_screen()
            if isinstance(event.message, AssistantMessage):
                self._countdown.clear()
                self._partial = None
                await transcript.end_reply(event.message)
                self._surface.status_bar.add_usage(event.message.usage)
            else:
                await transcript.append_message(event.message)
        elif isinstance(event, ToolExecutionStart):
            await self._flush_screen()
            transcript.tool_started(event.tool_call_id)
        elif isinstance(event, ToolExecutionEnd):
            self._progress.pop(event.tool_call_id, None)
            transcript.tool_finished(event.result)
        elif isinstance(event, AgentEnd):
            await self._flush_screen()
            self._countdown.clear()
            self._surface.status_bar.run_state = event.outcome

    async def flush(self) -> None:
        """Draw the streamed reply and the tools' progress noted since the last flush."""
        transcript = self._surface.transcript
        if self._partial is not None:
            await transcript.sync_reply(self._partial)
        if self._progress:
            progress, self._progress = self._progress, {}
            for call_id, (fraction, text) in progress.items():
                transcript.tool_progress(call_id, fraction, text)
