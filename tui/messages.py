"""The Textual messages that cross widgets, screens and workers.

Workers never touch widgets: they post one of these and a handler changes the screen.
Messages that arrive many times a second (stream deltas) define ``can_replace`` so a
newer one replaces a queued older one; the handler reads the live state, so nothing is lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message

from core.events import AgentEvent, MessageUpdate, ToolExecutionUpdate

if TYPE_CHECKING:
    from core.checkpoint.base import CheckpointData, Command
    from core.follow import ThreadChange
    from core.lease_status import LeaseView
    from core.messages import Usage
    from core.recovery import Diagnosis
    from tui.session import ThreadRow


@dataclass
class AgentEventReceived(Message):
    """An agent running ``thread_id`` emitted ``event`` (posted by the agent's listener)."""

    thread_id: str
    event: AgentEvent

    def can_replace(self, message: Message) -> bool:
        """A queued stream delta is superseded by a newer one of the same thread and kind.

        ``MessageUpdate`` carries the live partial message and tool progress carries the
        latest fraction, so only the newest of a run of them needs handling.
        """
        if not isinstance(message, AgentEventReceived) or message.thread_id != self.thread_id:
            return False
        mine, theirs = self.event, message.event
        if isinstance(mine, MessageUpdate) and isinstance(theirs, MessageUpdate):
            return True
        return (
            isinstance(mine, ToolExecutionUpdate)
            and isinstance(theirs, ToolExecutionUpdate)
            and mine.tool_call_id == theirs.tool_call_id
        )


@dataclass
class RunStarted(Message):
    """A run began on ``thread_id`` in this app (the picker shows it "running here")."""

    thread_id: str


@dataclass
class RunFinished(Message):
    """A run on ``thread_id`` ended with ``outcome``; ``error`` is one sentence when it could not run."""

    thread_id: str
    outcome: str | None = None
    error: str | None = None


@dataclass
class ThreadsLoaded(Message):
    """The thread list was read (``rows``, ``changed`` and ``listed`` as in
    ``tui.session.RowsUpdate``: the threads whose row differs from the previous list's,
    ``None`` for any), or reading it failed with one sentence (``error``)."""

    rows: list[ThreadRow] = field(default_factory=list)
    error: str | None = None
    changed: frozenset[str] | None = None
    listed: int | None = None
    """How many threads were listed, when more than ``rows`` (the rest are still being made)."""

    def can_replace(self, message: Message) -> bool:
        """A newer thread list supersedes a queued older one (errors are always shown); the
        newer one then also names the threads this one named, so no change is missed."""
        if not (isinstance(message, ThreadsLoaded) and message.error is None and self.error is None):
            return False
        if self.changed is None or message.changed is None:
            message.changed = None
        else:
            message.changed = self.changed | message.changed
        return True


@dataclass
class ThreadLoaded(Message):
    """A thread view's worker read ``thread_id`` from the store.

    ``data`` is ``None`` with ``error`` set when it could not be read; ``diagnosis`` is
    what :func:`core.recovery.diagnose` says of it.
    """

    thread_id: str
    data: CheckpointData | None = None
    diagnosis: Diagnosis | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    lease: LeaseView | None = None
    """Who runs the thread, when it was read by a follower (``None``: read without one)."""
    totals: Usage | None = None
    """The whole thread's token usage, summed as it was read (``None``: sum ``data.messages``)."""


@dataclass
class FollowerChanged(Message):
    """The follower of ``thread_id`` saw ``change`` (messages, stream, tools, lease, commands).

    Never replaced by a newer one: each change holds messages no other change holds.
    """

    thread_id: str
    change: ThreadChange


@dataclass
class CommandSent(Message):
    """A command for the run of ``thread_id`` in another process was queued (``command``),
    or could not be (``error``: one sentence)."""

    thread_id: str
    kind: str
    command: Command | None = None
    error: str | None = None


@dataclass
class StoreOpened(Message):
    """The app's worker opened the database, or failed with one sentence (``error``)."""

    error: str | None = None


@dataclass
class OpenThread(Message):
    """Show ``thread_id`` (posted by the picker; handled by the app).

    ``prompt`` starts a run at once (a new thread); ``new`` allows an id the store lacks.
    """

    thread_id: str
    prompt: str | None = None
    new: bool = False


@dataclass
class NewThread(Message):
    """Ask for a first prompt and start a new thread with it (handled by the app)."""


@dataclass
class CloseThread(Message):
    """Leave the view of ``thread_id`` and go back to the picker (handled by the app).

    ``error`` is one sentence to show after leaving (the thread could not be read).
    """

    thread_id: str
    error: str | None = None


@dataclass
class NeedsAttention(Message):
    """``thread_id`` started waiting for an answer or crashed (``sentence`` says which, for
    the notice); the app rings the bell and shows it as the session's ``Alerts`` allow.
    Posted once per request or crashed run (:class:`tui.attention.AttentionWatch`)."""

    thread_id: str
    sentence: str
