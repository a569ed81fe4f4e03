"""The supervision records of the Redis store: tool journal, jobs, leases, live events, commands.

:class:`RedisSupervised` is a base of :class:`~core.checkpoint.redis.RedisCheckpointer`;
the method contracts are in :mod:`core.checkpoint.capabilities`. Journal entries, jobs,
leases and commands are JSON in hashes, each changed by one compare-and-set of its field
(:meth:`~core.checkpoint.redis_store.RedisStore._cas`: read, decide in Python with the
contract's own rules, write in a Lua script only if nobody changed the field meanwhile,
the lease fence inside that script). Live events are a stream per thread. On a store of
CubePi's example layout (browse-only, no version of ours) the readers return ``None`` /
empty and the writers raise ``ReadOnlyStoreError``.

Every read and write is scoped by the store's owner on the server (the ``FIELD``, ``CAS``,
``READ`` and other scripts of :mod:`core.checkpoint.redis_scripts`); leases and commands are
kept per owner besides (:class:`~core.checkpoint.redis_keys.Keys`), so ``list_leases`` and
``update_command`` by seq read only this owner's. Revisions: a job's, a lease's and a
command's go up by one per write of the record, computed from the record as read and
written only if it is still that record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from core.checkpoint import redis_records as records
from core.checkpoint.base import (
    Command,
    CommandKind,
    CommandStatus,
    JobRecord,
    JournalEntry,
    Lease,
    LiveEvent,
    check_command_edit,
    check_command_kind,
    check_command_move,
    check_command_status,
    check_tool_phase,
    command_record_name,
    encode_job_result,
    lease_held,
    no_such_command,
    revision_conflict,
)
from core.checkpoint.redis_store import KEEP, RedisStore, now_arg, write_id


class RedisSupervised(RedisStore):
    """Journal, jobs, leases, live events and commands of one Redis store (see the module docstring)."""

    # --- tool journal ----------------------------------------------------------------------

    async def record_tool_event(
        self,
        thread_id: str,
        tool_call_id: str,
        phase: Literal["start", "end"],
        *,
        tool_name: str = "",
        run_id: str | None = None,
        job_key: str | None = None,
        at: float | None = None,
        holder_id: str | None = None,
    ) -> None:
        """See ``ToolJournal.record_tool_event``: ``tool_name``, ``run_id`` and ``job_key``
        overwrite the entry's only when given; a ``start`` clears an earlier end (a resume
        re-ran the call); an ``end`` without a ``start`` is kept. Raises ``ValueError`` for
        another ``phase``."""
        check_tool_phase(phase)
        self._check_writable()
        when = time.time() if at is None else at

        def decide(current: bytes | None) -> str:
            old = records.decode_journal(current) or JournalEntry(tool_call_id)
            new = replace(
                old,
                tool_name=tool_name or old.tool_name,
                run_id=run_id if run_id is not None else old.run_id,
                job_key=job_key if job_key is not None else old.job_key,
            )
            new = replace(new, started_at=when, ended_at=None) if phase == "start" else replace(new, ended_at=when)
            return records.encode_journal(new)

        await self._cas(
            "journal write",
            self._keys.journal(thread_id),
            tool_call_id,
            decide,
            thread_id=thread_id,
            holder_id=holder_id,
        )

    async def load_journal(self, thread_id: str) -> dict[str, JournalEntry] | None:
        """See ``ToolJournal.load_journal``: ``None`` on a store of the example's layout."""
        if self._version is None:
            return None
        raw = await self._read("journal read", thread_id, self._keys.journal(thread_id), "HGETALL")
        return {records.text(k): records.decode_journal(v) for k, v in records.pairs(raw)}  # type: ignore[misc]

    # --- jobs ------------------------------------------------------------------------------

    async def job_begin(
        self, thread_id: str, key: str, tool_call_id: str | None = None, *, holder_id: str | None = None
    ) -> JobRecord:
        """See ``Jobs.job_begin``: ``done`` is returned unchanged; absent is inserted as
        ``started`` with ``attempts=1``; ``started`` or ``failed`` starts again with
        ``attempts + 1``, a fresh ``started_at`` and no result. Atomic across processes (a
        compare-and-set), so of many callers beginning one key exactly one sees ``attempts == 1``."""
        self._check_writable()

        def decide(current: bytes | None) -> str | object:
            old = records.decode_job(current)
            if old is not None and old.status == "done":
                return KEEP
            return records.encode_job(
                JobRecord(
                    key=key,
                    status="started",
                    tool_call_id=tool_call_id if tool_call_id is not None else (old.tool_call_id if old else None),
                    started_at=time.time(),
                    attempts=old.attempts + 1 if old else 1,
                    revision=old.revision + 1 if old else 1,
                )
            )

        stored = await self._cas(
            "job start", self._keys.jobs(thread_id), key, decide, thread_id=thread_id, holder_id=holder_id
        )
        record = records.decode_job(stored)
        assert record is not None  # the field was written, or held a done job
        return record

    async def job_finish(
        self,
        thread_id: str,
        key: str,
        status: Literal["done", "failed"],
        result: Any = None,
        *,
        holder_id: str | None = None,
    ) -> None:
        """See ``Jobs.job_finish``: a job already ``done`` stays as it is (the first result
        wins). Raises ``KeyError`` if never begun, ``ValueError`` for another ``status``,
        ``TypeError`` when ``result`` is not JSON (nothing written)."""
        stored_result = json.loads(encode_job_result(key, status, result))
        self._check_writable()

        def decide(current: bytes | None) -> str | object:
            old = records.decode_job(current)
            if old is None:
                return KeyError(f"Job {key!r} of thread {thread_id!r} was never begun.")
            if old.status == "done":
                return KEEP
            return records.encode_job(
                replace(old, status=status, result=stored_result, finished_at=time.time(), revision=old.revision + 1)
            )

        await self._cas("job finish", self._keys.jobs(thread_id), key, decide, thread_id=thread_id, holder_id=holder_id)

    async def job_get(self, thread_id: str, key: str) -> JobRecord | None:
        """See ``Jobs.job_get``; ``None`` also on a store of the example's layout."""
        if self._version is None:
            return None
        return records.decode_job(await self._read("job read", thread_id, self._keys.jobs(thread_id), "HGET", key))

    # --- leases ----------------------------------------------------------------------------

    async def acquire_lease(self, lease: Lease, *, is_stale: Callable[[Lease], bool]) -> Lease:
        """See ``Leases.acquire_lease``: read, decide (``is_stale`` runs here, in this process)
        and compare-and-set, so of processes racing for one thread exactly one wins. The
        lease is stored as given but for its ``revision``: 1 for a new record, the current
        one's + 1 for a re-acquire or a takeover. Raises ``RunAlreadyClaimedError`` with
        ``lease`` set, ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()

        def decide(current: bytes | None) -> str | BaseException:
            held = records.decode_lease(current)
            if held is not None and held.holder_id != lease.holder_id and not is_stale(held):
                return lease_held(held)
            return records.encode_lease(replace(lease, revision=1 if held is None else held.revision + 1))

        leases = self._keys.leases(self._owner)
        stored = await self._cas("lease", leases, lease.thread_id, decide, thread_id=lease.thread_id)
        got = records.decode_lease(stored)
        assert got is not None
        return got

    async def renew_lease(self, thread_id: str, holder_id: str, heartbeat_at: float, expires_at: float) -> bool:
        """See ``Leases.renew_lease``: ``False`` once another holder took it (nothing written);
        the revision goes up by one. ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()

        def decide(current: bytes | None) -> str | object:
            held = records.decode_lease(current)
            if held is None or held.holder_id != holder_id:
                return KEEP
            return records.encode_lease(
                replace(held, heartbeat_at=heartbeat_at, expires_at=expires_at, revision=held.revision + 1)
            )

        leases = self._keys.leases(self._owner)
        stored = records.decode_lease(await self._cas("heartbeat", leases, thread_id, decide, thread_id=thread_id))
        return stored is not None and stored.holder_id == holder_id and stored.expires_at == expires_at

    async def release_lease(self, thread_id: str, holder_id: str) -> None:
        """See ``Leases.release_lease``; ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()

        def decide(current: bytes | None) -> object | None:
            held = records.decode_lease(current)
            return None if held is not None and held.holder_id == holder_id else KEEP

        await self._cas("lease release", self._keys.leases(self._owner), thread_id, decide, thread_id=thread_id)

    async def get_lease(self, thread_id: str) -> Lease | None:
        """See ``Leases.get_lease``; ``None`` on a store of the example's layout."""
        if self._version is None:
            return None
        leases = self._keys.leases(self._owner)
        return records.decode_lease(await self._read("lease read", thread_id, leases, "HGET", thread_id))

    async def list_leases(self) -> dict[str, Lease]:
        """See ``Leases.list_leases``: one ``HGETALL`` of this owner's leases (the hash holds
        only the leases of this owner's threads: every write of it checks the owner)."""
        if self._version is None:
            return {}
        client = self._live_client()
        leases = self._keys.leases(self._owner)
        raw = await self._call("lease read", lambda: client.hgetall(leases))
        return {records.text(k): records.decode_lease(v) for k, v in raw.items()}  # type: ignore[misc]

    # --- live events -----------------------------------------------------------------------

    async def append_live_events(
        self, thread_id: str, run_id: str | None, events: Sequence[dict[str, Any]], *, keep: int = 2000
    ) -> None:
        """See ``LiveEvents.append_live_events``: one script adds the batch to the thread's
        stream and trims it to the newest ``keep``. Each event's ``seq`` is the sequence part
        of its stream id ``0-{seq}``, taken from one counter per store, so it is an integer
        that increases across threads and prunes. Every event of a batch gets the same
        ``at``. Raises ``TypeError`` (nothing written) when an event is not JSON."""
        if not events:
            return
        try:
            texts = [records.dumps(e) for e in events]
        except ValueError as error:
            raise TypeError(f"A live event cannot be stored: {error}.") from None
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k = self._keys
        keys = [*k.scope(thread_id), k.live(thread_id), k.live_seq, k.changes, marker]
        args = [thread_id, self._owner, "0" if run_id is None else "1", run_id or "", now_arg(), max(keep, 0), ttl]
        reply = await self._call("live events", lambda: self._script("LIVE_APPEND", keys, [*args, *texts]))
        if reply[0] == b"unavailable":
            self._unavailable(thread_id)

    async def read_live_events(self, thread_id: str, after_seq: int = 0) -> list[LiveEvent]:
        """See ``LiveEvents.read_live_events`` (an ``XRANGE`` after ``0-{after_seq}``)."""
        if self._version is None:
            return []
        low = f"(0-{after_seq}" if after_seq > 0 else "-"
        entries = await self._read("live read", thread_id, self._keys.live(thread_id), "XRANGE", low, "+")
        out = []
        for entry_id, flat in entries or []:
            fields = dict(records.pairs(flat))
            run = fields.get(b"r")
            out.append(
                LiveEvent(
                    seq=int(entry_id.split(b"-")[1]),
                    thread_id=thread_id,
                    run_id=None if run is None else records.text(run),
                    data=json.loads(fields[b"d"]),
                    at=float(fields[b"at"]),
                )
            )
        return out

    async def prune_live_events(self, thread_id: str) -> None:
        """See ``LiveEvents.prune_live_events``; ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()
        keys = [*self._keys.scope(thread_id), self._keys.live(thread_id), self._keys.changes]
        reply = await self._call("live prune", lambda: self._script("PRUNE_LIVE", keys, [thread_id, self._owner]))
        if reply[0] == b"unavailable":
            self._unavailable(thread_id)

    # --- commands --------------------------------------------------------------------------

    async def send_command(self, thread_id: str, kind: CommandKind, text: str = "") -> Command:
        """See ``Commands.send_command``; ``seq`` comes from one counter per store, the
        revision is 1. Raises ``ValueError`` for an unknown ``kind``, ``ThreadNotFoundError``
        for another owner's thread."""
        check_command_kind(kind)
        self._check_writable()
        now = time.time()
        command = Command(0, thread_id, kind, text, "pending", now, now)
        marker, ttl = self._write_args(write_id())
        k = self._keys
        keys = [
            *k.scope(thread_id),
            k.commands(self._owner),
            k.command_seq,
            k.thread_commands(thread_id),
            k.changes,
            marker,
        ]
        args = [thread_id, self._owner, repr(now), records.encode_command(command), ttl]
        reply = await self._call("command", lambda: self._script("SEND_COMMAND", keys, args))
        if reply[0] == b"unavailable":
            self._unavailable(thread_id)
        return replace(command, seq=int(reply[1]))  # type: ignore[arg-type]

    async def update_command(
        self, seq: int, status: CommandStatus, note: str = "", *, expected_revision: int | None = None
    ) -> Command:
        """See ``Commands.update_command``: the revision and then the move (by
        :func:`~core.checkpoint.base.check_command_move`) are checked on the command as read
        from this owner's commands, and it is written, revision one higher, only if it is
        still that (a compare-and-set whose script checks the thread's owner too), so a
        discard in one process is never overwritten by a runner in another. ``KeyError`` for
        an unknown ``seq`` or another owner's (one sentence), ``ValueError`` for an unknown
        ``status``, ``ConflictError`` for another revision than ``expected_revision``,
        ``CommandTransitionError`` for a move ``COMMAND_TRANSITIONS`` does not allow."""
        check_command_status(status)
        self._check_writable()

        def decide(current: bytes | None) -> str | BaseException:
            if current is None:
                return no_such_command(seq)
            old = records.decode_command(seq, current)
            if expected_revision is not None and expected_revision != old.revision:
                return revision_conflict(old.thread_id, command_record_name(seq), expected_revision, old.revision)
            check_command_move(old, status)
            return records.encode_command(
                replace(old, status=status, note=note, updated_at=time.time(), revision=old.revision + 1)
            )

        def thread_of(current: bytes) -> str:
            return records.decode_command(seq, current).thread_id

        stored = await self._cas(
            "command update", self._keys.commands(self._owner), str(seq), decide, thread_id=thread_of
        )
        assert stored is not None
        return records.decode_command(seq, stored)

    async def edit_command(self, seq: int, text: str, *, expected_revision: int) -> Command:
        """See ``Commands.edit_command``: the same compare-and-set as :meth:`update_command`
        (revision, then :func:`~core.checkpoint.base.check_command_edit`, on the command as
        read from this owner's commands; written only if it is still that)."""
        self._check_writable()

        def decide(current: bytes | None) -> str | BaseException:
            if current is None:
                return no_such_command(seq)
            old = records.decode_command(seq, current)
            if expected_revision != old.revision:
                return revision_conflict(old.thread_id, command_record_name(seq), expected_revision, old.revision)
            check_command_edit(old)
            return records.encode_command(replace(old, text=text, updated_at=time.time(), revision=old.revision + 1))

        def thread_of(current: bytes) -> str:
            return records.decode_command(seq, current).thread_id

        stored = await self._cas(
            "command edit", self._keys.commands(self._owner), str(seq), decide, thread_id=thread_of
        )
        assert stored is not None
        return records.decode_command(seq, stored)

    async def list_commands(
        self, thread_id: str, statuses: Sequence[CommandStatus] | None = None, *, after: int = 0
    ) -> list[Command]:
        """See ``Commands.list_commands``."""
        if self._version is None:
            return []
        wanted = None if statuses is None else set(statuses)
        k = self._keys
        keys = [k.record(thread_id), k.thread_commands(thread_id), k.commands(self._owner)]

        async def read() -> list[Command]:
            reply = await self._script("COMMANDS_READ", keys, [self._owner, after])
            if not reply:
                return []
            seqs, raws = reply
            return [records.decode_command(int(s), raw) for s, raw in zip(seqs, raws, strict=True) if raw is not None]

        found = await self._call("command read", read)
        return [c for c in found if wanted is None or c.status in wanted]
