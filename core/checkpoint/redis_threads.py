"""Each thread's own record and its tool steps in the Redis store: owners, fingerprints,
step records, deleting a thread.

:class:`RedisThreads` is a base of :class:`~core.checkpoint.redis.RedisCheckpointer`; the
method contracts are in :mod:`core.checkpoint.capabilities` (``OwnerScoped``,
``ThreadRecords``, ``ToolSteps``, ``ThreadDeletion``). The record is the hash
``tui:rec:{thread_id}`` and the step records the fields of ``tui:steps:{thread_id}`` (see
:mod:`core.checkpoint.redis_keys`); each write is one script of
:mod:`core.checkpoint.redis_scripts` that checks the owner, the fence and the revision
before it writes anything, each read one read-only script that checks the owner.
"""

from __future__ import annotations

from typing import Any

from core.checkpoint import redis_read as read
from core.checkpoint import redis_records as records
from core.checkpoint.base import (
    FINGERPRINTS_RECORD,
    FingerprintOverride,
    Fingerprints,
    StepRecord,
    ThreadMeta,
    deletion_refused,
    encode_fingerprints,
    encode_override,
    encode_step_data,
    input_conflict,
    revision_conflict,
    step_never_begun,
    step_record_name,
)
from core.checkpoint.redis_keys import STEP_FIELDS
from core.checkpoint.redis_store import now_arg, write_id
from core.checkpoint.redis_supervised import RedisSupervised
from core.owners import UNOWNED


class RedisThreads(RedisSupervised):
    """Thread records, fingerprints, tool steps and deletion of one Redis store (see the module docstring)."""

    # --- owners ----------------------------------------------------------------------------

    async def unowned_count(self) -> int:
        """See ``OwnerScoped.unowned_count``: the size of the unowned scope's listing index
        (``ZCARD``; on a store of the example's layout, where every thread is unowned, the
        threads a ``SCAN`` finds). Never counts a named owner's threads: they have indexes
        of their own."""
        client = self._live_client()

        async def count() -> int:
            if self._version is None:
                return len(await read.scan_threads(client, self._keys))
            return int(await client.zcard(self._keys.index(UNOWNED)))

        return await self._call("count", count)

    # --- thread records --------------------------------------------------------------------

    async def load_meta(self, thread_id: str) -> ThreadMeta | None:
        """See ``ThreadRecords.load_meta`` (the ``META`` script: the owner checked in it)."""
        keys = self._keys.scope(thread_id)
        reply = await self._call("record read", lambda: self._script("META", keys, [thread_id, self._owner]))
        return None if reply == 0 else records.decode_meta(thread_id, reply)  # type: ignore[arg-type]

    async def save_fingerprints(
        self,
        thread_id: str,
        fingerprints: Fingerprints,
        *,
        expected_revision: int,
        override: FingerprintOverride | None = None,
    ) -> ThreadMeta:
        """See ``ThreadRecords.save_fingerprints``: one script compares the record's revision
        with ``expected_revision`` and only then writes the fingerprints, the override and
        the revision one higher."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        keys = [*self._keys.scope(thread_id), self._keys.changes, marker]
        text = encode_fingerprints(fingerprints)
        extra = "" if override is None else encode_override(override)

        async def attempt() -> list[Any]:
            args = [thread_id, self._owner, now_arg(), ttl, expected_revision, text, extra]
            return await self._script("FINGERPRINTS", keys, args)

        reply = await self._call("fingerprints", attempt)
        if reply[0] == b"unavailable":
            self._unavailable(thread_id)
        if reply[0] == b"conflict":
            raise revision_conflict(thread_id, FINGERPRINTS_RECORD, expected_revision, int(reply[1]))  # type: ignore[arg-type]
        return records.decode_meta(thread_id, reply[1])  # type: ignore[arg-type]

    # --- tool steps ------------------------------------------------------------------------

    async def step_begin(
        self,
        thread_id: str,
        key: str,
        *,
        input_fingerprint: str,
        workflow: str,
        total_steps: int | None = None,
        tool_call_id: str | None = None,
        holder_id: str | None = None,
    ) -> StepRecord:
        """See ``ToolSteps.step_begin``: one script (owner, fence, the record's input and
        workflow compared, or the record created at step 0, revision 0)."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        keys = self._step_keys(thread_id, marker)

        async def attempt() -> list[Any]:
            args = [thread_id, self._owner, holder_id or "", now_arg(), ttl, key, input_fingerprint, workflow]
            args += ["0", ""] if total_steps is None else ["1", total_steps]
            args += ["0", ""] if tool_call_id is None else ["1", tool_call_id]
            reply = await self._script("STEP_BEGIN", keys, args)
            self._step_refusal(thread_id, key, reply, holder_id, args[3], None)
            return reply

        reply = await self._call("step start", attempt)
        record = records.decode_step(thread_id, key, reply[1])
        assert record is not None  # the script returned the record it found or made
        return record

    async def step_commit(
        self,
        thread_id: str,
        key: str,
        *,
        expected_revision: int,
        workflow: str,
        next_step: int,
        data: Any,
        holder_id: str | None = None,
    ) -> StepRecord:
        """See ``ToolSteps.step_commit``: the lesson's ``UPDATE ... WHERE revision = ? AND
        workflow = ?`` as one script (``STEP_COMMIT``), which makes every check (owner,
        fence, the record begun, its workflow, its revision) before it writes ``next_step``,
        ``data`` and the revision one higher. Redis has no rollback, which is why every check
        comes first: a script runs whole or not at all, so a process killed before or while
        it is sent, or an exception before it (the ``_before_commit`` test seam), leaves the
        earlier record exactly as it was. Another workflow is reported before a stale revision."""
        text = encode_step_data(key, data)
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        keys = self._step_keys(thread_id, marker)

        async def attempt() -> list[Any]:
            args = [thread_id, self._owner, holder_id or "", now_arg(), ttl, key, expected_revision, workflow]
            await self._at_commit("step")
            reply = await self._script("STEP_COMMIT", keys, [*args, next_step, text])
            self._step_refusal(thread_id, key, reply, holder_id, args[3], expected_revision)
            return reply

        reply = await self._call("step commit", attempt)
        record = records.decode_step(thread_id, key, reply[1])
        assert record is not None  # the record the script just updated
        return record

    async def step_get(self, thread_id: str, key: str) -> StepRecord | None:
        """See ``ToolSteps.step_get`` (one ``HMGET`` of the record's columns, the owner checked with it)."""
        if self._version is None:
            return None
        fields = [f"{letter}:{key}" for letter in STEP_FIELDS]
        reply = await self._read("step read", thread_id, self._keys.steps(thread_id), "HMGET", *fields)
        return None if reply is None else records.decode_step(thread_id, key, reply)

    async def list_steps(self, thread_id: str) -> list[StepRecord]:
        """See ``ToolSteps.list_steps``: by ``key`` (one ``HGETALL``, the owner checked with it)."""
        if self._version is None:
            return []
        reply = await self._read("step read", thread_id, self._keys.steps(thread_id), "HGETALL")
        return records.decode_steps(thread_id, reply)

    def _step_keys(self, thread_id: str, marker: str) -> list[str]:
        k = self._keys
        return [*k.scope(thread_id), k.steps(thread_id), k.leases(self._owner), k.changes, marker]

    def _step_refusal(
        self, thread_id: str, key: str, reply: list[Any], holder_id: str | None, now: str, expected: int | None
    ) -> None:
        """Raise what a step script's refusal ``reply`` says; nothing when it says ``ok``."""
        kind = reply[0]
        if kind == b"unavailable":
            self._unavailable(thread_id)
        if kind == b"lease":
            self._lease_lost(thread_id, holder_id or "", reply[1], now)
        if kind == b"input":
            raise input_conflict(thread_id, step_record_name(key))
        if kind == b"missing":
            raise step_never_begun(thread_id, key)
        if kind == b"conflict":
            raise revision_conflict(thread_id, step_record_name(key), expected, int(reply[1]))

    # --- deletion --------------------------------------------------------------------------

    async def delete_thread(self, thread_id: str) -> None:
        """See ``ThreadDeletion.delete_thread``: one script deletes every key and field of
        the thread, after checking its owner and that no lease live at ``now`` (its
        ``expires_at`` in the future) holds it. Raises ``ThreadNotFoundError``,
        ``RunAlreadyClaimedError`` (with the lease) or ``ReadOnlyStoreError``."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner = self._keys, self._owner
        keys = [
            *k.scope(thread_id),
            k.commands(owner),
            k.leases(owner),
            k.index(owner),
            k.first,
            k.changes,
            marker,
            k.answers(thread_id),
        ]
        reply = await self._call("delete", lambda: self._script("DELETE", keys, [thread_id, owner, now_arg(), ttl]))
        if reply[0] == b"unavailable":
            self._unavailable(thread_id)
        if reply[0] == b"leased":
            lease = records.decode_lease(reply[1])
            assert lease is not None
            raise deletion_refused(lease)
