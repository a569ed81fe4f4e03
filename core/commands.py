"""The app side of supervision: commands for a thread that a runner in another process runs.

:func:`send` queues an abort, steer or follow-up in the store's command table for the
thread's runner (a :class:`core.supervisor.Supervisor`) and refuses in one sentence when
no run holds a live lease (:func:`core.lease_status.lease_status`); :func:`undelivered` and
:func:`discard` handle the steers and follow-ups a crashed runner never delivered
(``Supervisor.resume(include_pending=True)`` sends them with the resume), and
:func:`refuse_orphaned_aborts` settles the aborts it never took. The notes a refused
command carries, and :func:`settle`, the one way a command is moved without racing
whoever settles it meanwhile, are shared with the runner side. How a command travels
(``pending`` -> ``delivered`` -> ``applied``, or ``refused``) is told in :mod:`core.supervisor`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from core.checkpoint.base import (
    TEXTLESS_KINDS,
    Command,
    CommandKind,
    CommandStatus,
    Lease,
    check_command_kind,
    thread_unavailable,
)
from core.checkpoint.capabilities import Commands, CommandStore, OwnerScoped, supports
from core.errors import (
    CommandError,
    CommandRaced,
    CommandTransitionError,
    ConflictError,
    ThreadCrashedError,
    ThreadNotRunningError,
)
from core.lease_status import LeaseState, lease_status
from core.messages import UserMessage
from core.owners import UNOWNED

_log = logging.getLogger(__name__)

RUN_ENDED = "run ended; send it as a new prompt"
"""The note on a steer or follow-up that :func:`send` queued as the run ended (the caller is
told, with the text, and offers it as a new prompt). One the runner did not deliver before
its run ended stays ``pending`` (or ``delivered`` if its message was never saved): the user
sends or discards it (:func:`undelivered`), it is never refused for them."""

ABORT_TOO_LATE = "run ended before the abort took effect"
"""The note on an abort that reached a runner whose run had already ended."""

ORPHANED_ABORT = "its runner stopped before taking it; nothing is running to abort"
"""The note on an abort whose runner died (its lease is no longer live) before applying it."""


async def send(store: CommandStore, thread_id: str, kind: CommandKind, text: str = "") -> Command:
    """Queue ``kind`` (a :data:`~core.checkpoint.base.CommandKind`: abort, steer, follow-up, stop
    after this turn, interrupt and steer, note) for the run of ``thread_id``
    and return the ``pending`` command; its runner's :class:`~core.supervisor.Supervisor` takes it from there.

    Raises :class:`~core.errors.ThreadCrashedError` when the thread's runner crashed ("resume it
    first"), :class:`~core.errors.ThreadNotRunningError` when no run holds a live lease (for a steer
    or follow-up the sentence says to send it as a new prompt), ``ThreadNotFoundError``
    (:func:`~core.checkpoint.base.thread_unavailable`) when the thread is missing or
    another owner's (the store sees neither, so both read the same), :class:`~core.errors.CommandError`
    for a steer or follow-up without text, ``ValueError`` for another ``kind``, and the
    store's errors. A run that ends between the check and the insert is caught by a
    second look at the lease: the command is then marked ``refused`` and the same error
    raised. For an agent running in this process without a Supervisor, call its methods.
    """
    check_command_kind(kind)
    if kind not in TEXTLESS_KINDS and not text.strip():
        raise CommandError(f"A {_kind_words(kind)} needs some text.")
    lease = await store.get_lease(thread_id)
    view = lease_status(lease, (), time.time())
    if lease is None and await store.load(thread_id) is None:
        # Not this owner's thread, or none at all: the store's reads cannot tell which.
        raise thread_unavailable(thread_id, store.owner if supports(store, OwnerScoped) else UNOWNED)
    if not view.live:
        raise await _refusal(store, thread_id, kind, lease)
    command = await store.send_command(thread_id, kind, text)
    lease = await store.get_lease(thread_id)
    if not lease_status(lease, (), time.time()).live:
        error = await _refusal(store, thread_id, kind, lease)
        # Only if the runner did not take it meanwhile (a runner never delivers after its run ended).
        if any(c.seq == command.seq for c in await store.list_commands(thread_id, ["pending"])):
            await settle(store, command.seq, "refused", ABORT_TOO_LATE if kind in TEXTLESS_KINDS else RUN_ENDED)
        raise error
    return command


async def _refusal(store: CommandStore, thread_id: str, kind: str, lease: Lease | None) -> ThreadNotRunningError:
    data = await store.load(thread_id) if lease is not None else None
    view = lease_status(lease, data.runs if data else (), time.time())
    if view.state is LeaseState.CRASHED:
        where = f"process {lease.pid} on {lease.host}" if lease else "its runner"
        return ThreadCrashedError(
            f"Thread {thread_id!r} is not running: {where} stopped without finishing the run; "
            f"resume the thread first{'' if kind in TEXTLESS_KINDS else ', then send the ' + _kind_words(kind)}.",
            view=view,
        )
    if kind in TEXTLESS_KINDS:
        return ThreadNotRunningError(
            f"Thread {thread_id!r} is not running, so there is nothing to {'abort' if kind == 'abort' else 'stop'}.",
            view=view,
        )
    return ThreadNotRunningError(
        f"Thread {thread_id!r} is not running (its last run ended); send the {_kind_words(kind)} as a new prompt.",
        view=view,
    )


def _kind_words(kind: str) -> str:
    return {"follow_up": "follow-up", "stop": "stop after this turn", "interrupt": "interrupting steer"}.get(kind, kind)


async def refuse_orphaned_aborts(store: CommandStore, thread_id: str) -> list[Command]:
    """Mark ``refused`` the aborts of ``thread_id`` still pending or delivered although no run
    holds its live lease (their runner died first), and return them, updated; ``[]`` while a
    run holds the lease. An abort has nothing left to stop, unlike a steer or follow-up,
    which :func:`undelivered` keeps for the resume. One settled meanwhile (the runner applied
    it, a resume refused it) is left as it is. Raises the store's errors (a browse-only store
    raises ``ReadOnlyStoreError``)."""
    if lease_status(await store.get_lease(thread_id), (), time.time()).live:
        return []
    out = []
    for c in await store.list_commands(thread_id, ["pending", "delivered"]):
        if c.kind in TEXTLESS_KINDS:
            try:
                out.append(await store.update_command(c.seq, "refused", ORPHANED_ABORT))
            except CommandTransitionError:
                pass
    return out


async def undelivered(store: CommandStore, thread_id: str) -> list[Command]:
    """Steers and follow-ups that never reached the thread's conversation, in send order.

    That is: ``pending`` ones, and ``delivered`` ones whose runner stopped before their
    message was persisted. One whose message *was* persisted (the runner died before
    saying so) is marked ``applied`` here and not listed. While a run holds a live lease
    its commands are in flight: nothing is listed. Raises the store's errors.
    """
    lease = await store.get_lease(thread_id)
    if lease_status(lease, (), time.time()).live:
        return []
    commands = [
        c for c in await store.list_commands(thread_id, ["pending", "delivered"]) if c.kind not in TEXTLESS_KINDS
    ]
    if not commands:
        return []
    data = await store.load(thread_id)
    persisted = {
        m.metadata.get("command_seq")
        for m in (data.messages if data else ())
        if isinstance(m, UserMessage) and m.metadata and "command_seq" in m.metadata
    }
    out = []
    for c in commands:
        if c.seq in persisted:
            await settle(store, c.seq, "applied", "found in the conversation after its runner stopped")
        else:
            out.append(c)
    return out


async def discard(store: CommandStore, thread_id: str, seqs: Sequence[int] | None = None) -> list[Command]:
    """Mark undelivered steers and follow-ups (all, or those in ``seqs``) ``discarded`` and
    return those this call discarded, updated (one settled meanwhile by someone else -
    delivered with a resume, discarded from another window - is left out). Raises
    :class:`~core.errors.CommandError` while a run holds the thread's live lease (its commands are in
    flight), ``KeyError`` for a seq that is not an undelivered steer or follow-up of the
    thread (nothing is discarded then), and the store's errors."""
    lease = await store.get_lease(thread_id)
    if lease_status(lease, (), time.time()).live:
        raise CommandError(
            f"Thread {thread_id!r} is running; its steers and follow-ups are on their way and cannot be discarded."
        )
    pending = {c.seq: c for c in await undelivered(store, thread_id)}
    wanted = list(pending) if seqs is None else list(seqs)
    for seq in wanted:
        if seq not in pending:
            raise KeyError(f"Command {seq} is not an undelivered steer or follow-up of thread {thread_id!r}.")
    done = [await settle(store, seq, "discarded", "discarded by the user") for seq in wanted]
    return [c for c in done if c is not None]


def turn_note(turn: int) -> str:
    """The note of a steer, follow-up or note applied in ``turn`` (1: the run's first turn)."""
    return f"delivered at turn {turn}"


CANCELLED = "cancelled by the user before delivery"
"""The note on a steer or follow-up the user cancelled (:func:`cancel`)."""


async def edit(store: CommandStore, command: Command, text: str) -> Command:
    """Replace the text of the queued steer or follow-up ``command`` (as the caller last saw
    it) with ``text`` and return it, updated: a compare-and-set on its row
    (``Commands.edit_command`` at ``command.revision``), so it never overtakes its runner.
    One ``delivered`` whose run ended unsaved is replaced by a new command (returned).

    Raises :class:`~core.errors.CommandError` for an abort or an empty text, and
    :class:`CommandRaced` (one sentence; the command as stored, and ``text``) when it was
    delivered, edited or settled meanwhile: nothing was changed. The store's other errors
    propagate."""
    if command.kind in TEXTLESS_KINDS:
        raise CommandError(f"{_kind_words(command.kind).capitalize()} #{command.seq} has no text to edit.")
    if not text.strip():
        raise CommandError(f"A {_kind_words(command.kind)} needs some text; cancel it to send nothing.")
    if command.status == "delivered":
        return await _replace(store, command, text)
    try:
        return await store.edit_command(command.seq, text, expected_revision=command.revision)
    except (CommandTransitionError, ConflictError):
        raise _edit_raced(await _current(store, command), text) from None


def _edit_raced(current: Command, text: str) -> CommandRaced:
    """The error for an edit of ``current`` (as now stored) that lost to its runner or to
    another window: it keeps the ``text`` typed, so nothing is lost."""
    words = f"{_kind_words(current.kind).capitalize()} #{current.seq}"
    if current.status == "pending":
        # Still queued, so nobody delivered it: another window changed its text first.
        sentence = f"{words} was edited meanwhile, so your edit was not applied; edit it again to replace that text."
    else:
        sentence = f"{words} was {current.status} meanwhile, as first written, so your edit was not applied."
    return CommandRaced(sentence, command=current, text=text)


async def _replace(store: CommandStore, command: Command, text: str) -> Command:
    """Edit a ``delivered`` command whose run ended before its message was saved (it is the
    user's again, :func:`undelivered`, but no longer ``pending``, so the store will not edit
    it): queue the edit as a new command first, then discard the old one by compare-and-set.
    A crash in between leaves both listed, never neither; a resume that delivered the old
    one meanwhile wins, and the new one is discarded again."""
    lease = await store.get_lease(command.thread_id)
    if lease_status(lease, (), time.time()).live:
        raise CommandRaced(
            f"{_kind_words(command.kind).capitalize()} #{command.seq} is with the running agent, "
            "as first written, so your edit was not applied.",
            command=command,
            text=text,
        )
    new = await store.send_command(command.thread_id, command.kind, text)
    try:
        await store.update_command(
            command.seq, "discarded", f"replaced by #{new.seq}", expected_revision=command.revision
        )
    except (CommandTransitionError, ConflictError):
        await settle(store, new.seq, "discarded", f"#{command.seq} was sent meanwhile")
        raise _edit_raced(await _current(store, command), text) from None
    return new


async def cancel(store: Commands, command: Command) -> Command:
    """Mark the queued steer or follow-up ``command`` (as the caller last saw it)
    ``discarded`` and return it, updated: a compare-and-set at ``command.revision``, so one
    its runner delivered meanwhile is left alone. Works while its run goes on (a pending
    command is not yet the agent's) and after it ended (a ``delivered`` one whose message
    was never saved, :func:`undelivered`).

    Raises :class:`~core.errors.CommandError` for an abort, :class:`CommandRaced` (one
    sentence) when it was delivered or settled meanwhile, and the store's errors."""
    if command.kind in TEXTLESS_KINDS:
        raise CommandError(
            f"{_kind_words(command.kind).capitalize()} #{command.seq} cannot be cancelled; it is on its way."
        )
    try:
        return await store.update_command(command.seq, "discarded", CANCELLED, expected_revision=command.revision)
    except (CommandTransitionError, ConflictError):
        current = await _current(store, command)
        words = f"{_kind_words(command.kind).capitalize()} #{command.seq}"
        raise CommandRaced(
            f"{words} was edited meanwhile, so it was not cancelled; cancel it again to drop it as edited."
            if current.status == "pending"
            else f"{words} was {current.status} meanwhile, so it could not be cancelled.",
            command=current,
            text=command.text,
        ) from None


async def _current(store: Commands, command: Command) -> Command:
    return next((c for c in await store.list_commands(command.thread_id) if c.seq == command.seq), command)


async def settle(store: Commands, seq: int, status: CommandStatus, note: str) -> Command | None:
    """Move command ``seq`` to ``status`` with ``note`` and return it, updated; ``None`` when
    it was settled meanwhile (the store refused the move with ``CommandTransitionError``,
    nothing changed). The store's other errors propagate. Both sides settle through here."""
    try:
        return await store.update_command(seq, status, note)
    except CommandTransitionError as exc:
        _log.info("command %s was not marked %s: %s", seq, status, exc)
        return None
