"""Mirror: draws what a :class:`~core.follow.ThreadFollower` sees into a :class:`Transcript`.

A thread run by another process reaches the app as :class:`~core.follow.ThreadChange`
objects: persisted messages (each in exactly one change), the reply streaming now and the
tools running now. The mirror appends each persisted message once, streams the partial
reply into a live view only when it is the next message to come (so nothing is drawn out
of order or twice), and moves the running tools' progress bars. Stream and progress are
drawn on the screen's flush timer, like an in-app run's.
"""

from __future__ import annotations

from core.follow import ThreadChange, ThreadModel
from core.messages import AssistantMessage
from tui.widgets.transcript import Transcript, merge_rows


class Mirror:
    """Renders one follower's changes into ``transcript``; see the module docstring."""

    def __init__(self, transcript: Transcript, model: ThreadModel, shown: int) -> None:
        self.transcript = transcript
        self.model = model
        """The follower's live model (read at every flush)."""
        self.shown = shown
        """How many persisted messages the transcript holds (the index of the next one)."""
        self.dirty = True
        """Whether the stream or the tools changed since the last flush."""
        self._live_index: int | None = None  # the message index the live view streams

    async def apply(self, change: ThreadChange) -> None:
        """Show the persisted messages of ``change``; note what the next flush must draw."""
        self.model = change.model
        transcript = self.transcript
        if change.reset:
            # Only `added`: the model's list may already hold messages of later changes.
            # A windowed follower's are the newest only: `offset` messages come before them.
            model = change.model
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
        if not change.model.lease_view.live and change.model.partial is None and transcript.live is not None:
            # Nobody runs the thread any more: a half-streamed reply will never be saved.
            await transcript.drop_live()
            self._live_index = None

    async def flush(self) -> None:
        """Draw the streaming reply and the running tools as the model holds them now."""
        if not self.dirty:
            return
        self.dirty = False
        model, transcript = self.model, self.transcript
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
