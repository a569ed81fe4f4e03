"""FollowedRun: draws a run of another process, from a follower's changes, into a thread screen.

A thread run by another process reaches the app as :class:`~core.follow.ThreadChange`
objects: persisted messages (each in exactly one change), the reply streaming now, the
tools running now and the model call's retry wait. :meth:`FollowedRun.apply` appends each
persisted message once, keeps the status bar's token counts and shows the retry wait;
the partial reply is streamed into a live view only when it is the next message to come
(so nothing is drawn out of order or twice), and the running tools' progress bars move,
both on the screen's flush timer (:meth:`FollowedRun.flush`), like a run here's
(:class:`~tui.screens.local_run.LocalRun`). Who runs the thread, the request it waits on
and its commands are the screen's to show (:class:`~tui.screens.thread_view.ThreadView`).
"""

from __future__ import annotations

import time

from core.follow import ThreadChange, ThreadModel
from core.messages import AssistantMessage
from core.outline import usage_of
from tui.screens.shown_run import RetryCountdown, RunSurface
from tui.widgets.transcript import merge_rows


class FollowedRun:
    """Draws one follower's changes into ``surface``; see the module docstring.

    ``model`` is the follower's live model and ``shown`` how many of the thread's persisted
    messages the transcript holds already; ``countdown`` is the screen's retry countdown (shared
    with a run here).
    """

    def __init__(self, surface: RunSurface, countdown: RetryCountdown, model: ThreadModel, shown: int) -> None:
        self._surface = surface
        self._countdown = countdown
        self.model = model
        """The follower's live model (read at every flush)."""
        self.shown = shown
        """How many persisted messages the transcript holds (the index of the next one)."""
        self.dirty = True
        """Whether the stream or the tools changed since the last flush."""
        self._live_index: int | None = None  # the message index the live view streams

    async def apply(self, change: ThreadChange) -> None:
        """Show the persisted messages of ``change``, the usage they add and the retry wait
        if it changed; note what the next flush must draw."""
        self.model = model = change.model
        transcript = self._surface.transcript
        if change.outlined and not change.reset:
            # The whole thread's count is known now: the index of the next message follows it.
            self.shown = model.count - len(change.added)
        if change.reset:
            # Only `added`: the model's list may already hold messages of later changes.
            # A windowed follower's are the newest only: `offset` messages come before them.
            added = list(change.added)
            entries = merge_rows(added, model.message_ids[: len(added)], model.problems)
            await transcript.sync_history(entries, unread=model.earlier, before=model.first_row_id)
            self.shown, self._live_index = model.offset + len(added), None
        else:
            for message in change.added:
                if transcript.live is not None:
                    if isinstance(message, AssistantMessage) and self._live_index == self.shown:
                        await transcript.end_reply(message)
                        self._live_index = None
                        self.shown += 1
                        continue
                    await transcript.drop_live()  # a reply that was never persisted
                    self._live_index = None
                await transcript.append_message(message)
                self.shown += 1
        if change.partial_reset or change.deltas or change.tools or change.reset:
            self.dirty = True
        if not model.lease_view.live and model.partial is None and transcript.live is not None:
            # Nobody runs the thread any more: a half-streamed reply will never be saved.
            await transcript.drop_live()
            self._live_index = None
        self._count_usage(change)
        if change.retry or change.reset:
            self.show_retry()

    def _count_usage(self, change: ThreadChange) -> None:
        status_bar, model = self._surface.status_bar, change.model
        if change.outlined and model.outline is not None:
            status_bar.set_totals(model.outline.totals)
        elif change.reset and model.ready:
            status_bar.set_totals(usage_of(change.added))
        elif not change.reset:
            for message in change.added:
                if isinstance(message, AssistantMessage):
                    status_bar.add_usage(message.usage)

    def show_retry(self) -> None:
        """Show the retry wait of the run followed, if any, else none. Its end is in the
        runner's unix seconds (see :mod:`core.live`), so a view that attaches late counts
        down right."""
        retry = self.model.retry
        if retry is None:
            self._countdown.clear()
        else:
            self._countdown.show(retry.wait, retry.until - time.time())

    async def flush(self) -> None:
        """Draw the streaming reply and the running tools as the model holds them now."""
        if not self.dirty:
            return
        self.dirty = False
        model, transcript = self.model, self._surface.transcript
        partial, index = model.partial, model.partial_index
        if partial is not None and index == self.shown and self._live_index in (None, index):
            self._live_index = index
            await transcript.sync_reply(partial)
        for tool in list(model.running_tools.values()):
            view = transcript.tool_views.get(tool.tool_call_id)
            if view is None:
                continue
            if view.status in ("pending", "streaming", "unanswered", "dangling"):
                view.start(tool.started_at)
            view.report(tool.progress, tool.text)
