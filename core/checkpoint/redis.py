"""Redis checkpointer on redis-py's asyncio client, in the layout of CubePi's custom-backend example.

Each thread is the example's two keys - a list of message JSON under
``{prefix}msgs:{thread_id}`` (RPUSH order is append order) and the extra JSON object under
``{prefix}extra:{thread_id}`` - so a program using that example reads our threads and we
read its. Everything else of ours lies beside them under ``{prefix}tui:`` (the key scheme:
:mod:`core.checkpoint.redis_keys`). The prefix is ``cubepi:`` unless the URL's ``prefix``
query parameter (``redis://host:6379/0?prefix=team:``) or ``open(prefix=...)`` says otherwise.

Opening (see :meth:`~core.checkpoint.redis_store.RedisStore.open`, which takes ``owner=``):
ours at this version is read-write; nothing under the prefix is created (or refused without ``create``); the
example's layout (no schema version of ours) or an older version of ours is browse-only
until :meth:`upgrade`; a newer version raises ``SchemaError``.

Atomicity: every write that checks something is one Lua script
(:mod:`core.checkpoint.redis_scripts`): an append checks its write id, the owner, the
lease fence and the runs, pushes the messages, bumps the thread in its owner's listing
index and adds to the change feed, all in one script. ``save_extra`` merges in Python
and writes with a script only if the extra is still what it merged into (and, given an
expected revision, the revision still that), retrying the merge when another writer got
there first, so no key is lost (the example's own read-modify-write loses keys) and
values are JSON written by Python, exact (Redis's Lua ``cjson`` would turn ``[]`` into
``{}`` and round numbers).

Owners (:mod:`core.owners`): a store is opened for one owner, and every script checks the
thread's record (``tui:rec:{thread_id}``) against it on the server; threads without a
record - the example's, and ours from before schema v3 - are the unowned scope's.

Message ids are list positions counting from 1 (see :mod:`core.checkpoint.redis_read`).

Change notification: every write of ours adds an entry to the stream
``{prefix}tui:changes``; :meth:`change_token` is its last id and :meth:`change_signals`
an ``XREAD BLOCK`` on it. Writes made with the example's own code (plain RPUSH/SET) do not
add to it, so they are seen at the next change of ours or a reload, not at once, and a
thread such code creates in an upgraded store is not in the listing index (it loads by
id, and is listed once a write of ours touches it); a
browse-only store of the example's layout has no feed, so its token is a digest of its
keys' lengths and extra values, polled once a second.

Only this module and its ``redis_*`` helpers import ``redis``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Collection, Hashable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.checkpoint import codec
from core.checkpoint import redis_listing as listing
from core.checkpoint import redis_read as read
from core.checkpoint.base import (
    EXTRA_RECORD,
    CheckpointData,
    ThreadSummary,
    extra_not_object,
    parse_extra,
    revision_conflict,
    run_completed_append,
    run_never_claimed,
    run_taken,
)
from core.checkpoint.capabilities import HumanAnswers, HumanRequests, SchemaUpgrade, SupervisedStore
from core.checkpoint.redis_keys import answer_field, answer_prefix
from core.checkpoint.redis_pages import RedisPages
from core.checkpoint.redis_records import encode_pending
from core.checkpoint.redis_store import CONNECT_TIMEOUT, KEEP, now_arg, write_id
from core.checkpoint.redis_threads import RedisThreads
from core.errors import AlreadyAnsweredError, StaleAnswerError
from core.hitl import run_key
from core.messages import AnyMessage, UserMessage

__all__ = ["BLOCK_MAX", "FOREIGN_POLL", "RedisCheckpointer"]

BLOCK_MAX = 5.0
"""Seconds one blocking read of the change feed waits at most; always under a third of
the socket timeout too, so a quiet feed never looks like a dead connection."""

FOREIGN_POLL = 1.0
"""Seconds between two looks at a browse-only store of the example's layout (it has no feed)."""


class RedisCheckpointer(RedisThreads, RedisPages, SupervisedStore, HumanRequests, HumanAnswers, SchemaUpgrade):
    """A :class:`~core.checkpoint.base.Checkpointer` and ``SupervisedStore`` on Redis.

    Build it with ``await RedisCheckpointer.open(url, create=..., on_status=..., prefix=..., owner=...)``;
    it is also an async context manager that closes itself. Every call rides out a lost
    connection (:func:`core.checkpoint.reconnect.with_reconnect`, then
    ``StoreConnectionError``); writes on a browse-only store raise ``ReadOnlyStoreError``.
    Times returned are unix seconds.
    """

    # --- the contract ----------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``: one read-only script (one consistent view, the owner
        checked in it; ``None`` for another owner's thread); undecodable entries in
        ``problems``; ``journal`` is ``None`` on a store of the example's layout; ``meta``
        ``None`` for a thread that keeps no record (the example's, ours before v3)."""
        client = self._live_client()
        script, owner = self._scripts["LOAD"], self._owner
        return await self._call(
            "load", lambda: read.load(client, script, self._keys, owner, thread_id, self._version, None)
        )

    async def load_after(self, thread_id: str, after_id: Any) -> CheckpointData:
        """See ``IncrementalReads.load_after``: ``LRANGE msgs after_id -1`` (ids are positions from 1)."""
        client = self._live_client()
        script, owner, after = self._scripts["LOAD"], self._owner, int(after_id or 0)
        data = await self._call(
            "load", lambda: read.load(client, script, self._keys, owner, thread_id, self._version, after)
        )
        return data if data is not None else CheckpointData()

    async def append(self, thread_id: str, messages: Sequence[AnyMessage], *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.append``: one Lua script (write id, owner, fence, run checks,
        RPUSH, index, change feed), so a retry after a lost reply appends nothing twice.
        ``ThreadNotFoundError`` for another owner's thread."""
        if not messages:
            return
        self._check_writable()
        texts = [codec.encode(m) for m in messages]
        run_ids = sorted({r for m in messages if (r := getattr(m, "run_id", None)) is not None})
        prompt = next((m.text for m in messages if isinstance(m, UserMessage)), None)
        marker, ttl = self._write_args(write_id())
        k, owner = self._keys, self._owner
        keys = [*k.scope(thread_id), k.leases(owner), k.index(owner), k.changes, marker, k.first]

        async def attempt() -> None:
            now = now_arg()
            args = [thread_id, owner, holder_id or "", now, ttl, "0" if prompt is None else "1", prompt or ""]
            reply = await self._script("APPEND", keys, [*args, len(run_ids), *run_ids, *texts])
            if reply[0] == b"unavailable":
                self._unavailable(thread_id)
            if reply[0] == b"lease":
                self._lease_lost(thread_id, holder_id or "", reply[1], now)
            if reply[0] == b"completed":
                raise run_completed_append(thread_id, (reply[1] or b"").decode())

        await self._call("append", attempt)

    async def save_extra(self, thread_id: str, extra: dict[str, Any], *, expected_revision: int | None = None) -> int:
        """See ``CheckedExtra.save_extra``: read the extra and its revision (a script that
        checks the owner), merge in Python, and write with the ``SAVE_EXTRA`` script only if
        the extra is still the text merged into and, with ``expected_revision``, the revision
        still that one; the merge is made again whenever another writer changed the extra
        first, so concurrent writers lose no key. Returns the new revision.

        Raises ``ConflictError`` (nothing written) when ``expected_revision`` is not the
        stored one, ``ThreadNotFoundError`` for another owner's thread, ``TypeError`` for
        values JSON cannot hold and ``CorruptRecordError`` when the stored extra is not a
        JSON object (it is left unchanged rather than overwritten).
        """
        patch = json.loads(codec.encode_extra(extra))  # the copy in; fails early on bad values
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner = self._keys, self._owner
        scope = k.scope(thread_id)
        keys = [*scope, k.index(owner), k.changes, marker]
        expected = "" if expected_revision is None else str(expected_revision)

        async def attempt() -> int:
            while True:
                seen = await self._script("EXTRA_READ", scope, [thread_id, owner])
                if seen[0] == b"unavailable":
                    self._unavailable(thread_id)
                revision, raw = int(seen[1]), seen[2] if len(seen) > 2 else None
                if expected_revision is not None and revision != expected_revision:
                    raise revision_conflict(thread_id, EXTRA_RECORD, expected_revision, revision)
                current, problem = parse_extra(raw, thread_id)
                if problem is not None:
                    raise extra_not_object(thread_id)
                current.update(patch)
                args = [thread_id, owner, now_arg(), ttl, "0" if raw is None else "1", raw or b""]
                await self._at_commit("extra")
                reply = await self._script("SAVE_EXTRA", keys, [*args, codec.encode_extra(current), expected])
                if reply[0] == b"retry":
                    continue
                if reply[0] == b"unavailable":
                    self._unavailable(thread_id)
                if reply[0] == b"conflict":
                    raise revision_conflict(thread_id, EXTRA_RECORD, expected_revision, int(reply[1]))  # type: ignore[arg-type]
                return int(reply[1])  # type: ignore[arg-type]

        return await self._call("save", attempt)

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``: the listing index and one read-only script per 500
        threads, which finds each tail on the server (:mod:`core.checkpoint.redis_listing`);
        ``SCAN`` on the example's layout."""
        return await self._listing(None)

    async def thread_versions(self) -> dict[str, Hashable]:
        """See ``ThreadVersions.thread_versions``: the index and one read-only script per 500
        threads (:func:`core.checkpoint.redis_listing.thread_versions`)."""
        client = self._live_client()
        script, owner = self._scripts["VERSIONS_CHUNK"], self._owner
        return await self._call(
            "listing", lambda: listing.thread_versions(client, self._keys, owner, self._version, script)
        )

    async def summaries(self, thread_ids: Collection[str]) -> list[ThreadSummary]:
        """See ``ThreadVersions.summaries``: :meth:`list_threads` of the named threads (their
        index scores, then the listing's script)."""
        return await self._listing(set(thread_ids)) if thread_ids else []

    async def _listing(self, among: set[str] | None) -> list[ThreadSummary]:
        client = self._live_client()
        chunk, owner = self._scripts["LIST_CHUNK"], self._owner
        return await self._call(
            "listing", lambda: listing.summaries(client, self._keys, owner, self._version, chunk, among)
        )

    async def claim_run(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.claim_run``: one script (write id, owner, fence, the run's
        state, the claim); the run's revision is 1. ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner = self._keys, self._owner
        keys = [*k.scope(thread_id), k.leases(owner), k.index(owner), k.changes, marker]

        async def attempt() -> None:
            now = now_arg()
            reply = await self._script("CLAIM", keys, [thread_id, owner, holder_id or "", now, ttl, run_id])
            if reply[0] == b"unavailable":
                self._unavailable(thread_id)
            if reply[0] == b"lease":
                self._lease_lost(thread_id, holder_id or "", reply[1], now)
            if reply[0] in (b"completed", b"claimed"):
                raise run_taken(thread_id, run_id, completed=reply[0] == b"completed")

        await self._call("claim", attempt)

    async def mark_run_complete(self, thread_id: str, run_id: str, *, holder_id: str | None = None) -> None:
        """See ``Checkpointer.mark_run_complete``: ``completion_seq`` is the thread's next
        number, in one script; the run's revision goes 1 -> 2. ``ThreadNotFoundError`` for
        another owner's thread."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner = self._keys, self._owner
        keys = [*k.scope(thread_id), k.leases(owner), k.changes, marker]

        async def attempt() -> None:
            now = now_arg()
            reply = await self._script("COMPLETE", keys, [thread_id, owner, holder_id or "", now, ttl, run_id])
            if reply[0] == b"unavailable":
                self._unavailable(thread_id)
            if reply[0] == b"lease":
                self._lease_lost(thread_id, holder_id or "", reply[1], now)
            if reply[0] == b"unclaimed":
                raise run_never_claimed(thread_id, run_id)

        await self._call("completion", attempt)

    async def save_pending_request(
        self, thread_id: str, request_json: str | None, *, run_id: str | None = None, holder_id: str | None = None
    ) -> None:
        """See ``HumanRequests.save_pending_request`` (one compare-and-set of ``tui:pending``,
        fenced by ``holder_id`` in the script); ``ThreadNotFoundError`` for another owner's thread."""
        self._check_writable()
        new = None if request_json is None else encode_pending(request_json, run_id, time.time())

        def decide(current: bytes | None) -> str | object | None:
            return KEEP if new is None and current is None else new

        await self._cas(
            "save", self._keys.pending, thread_id, decide, thread_id=thread_id, holder_id=holder_id, touch=True
        )

    # --- human answers ---------------------------------------------------------------------

    async def answer(self, thread_id: str, run_id: str | None, question_id: str, answer_json: str) -> None:
        """See ``HumanAnswers.answer``: one script (``ANSWER``: write id, owner, the pending
        request compared, ``HSETNX``, the change feed), so a retry after a lost reply is not
        taken for a second answer."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner, run = self._keys, self._owner, run_key(run_id)
        keys = [*k.scope(thread_id), k.answers(thread_id), k.changes, marker]
        args = [thread_id, owner, run, question_id, answer_field(run, question_id), answer_json, ttl]
        reply = await self._call("answer", lambda: self._script("ANSWER", keys, args))
        kind = reply[0]
        if kind == b"unavailable":
            self._unavailable(thread_id)
        if kind == b"stale":
            raise StaleAnswerError.of(thread_id, question_id)
        if kind == b"answered":
            raise AlreadyAnsweredError.of(thread_id, question_id, (reply[1] or b"").decode())

    async def load_answer(self, thread_id: str, run_id: str | None, question_id: str) -> str | None:
        """See ``HumanAnswers.load_answer``: one ``HGET`` made by the owner-checking ``READ`` script."""
        field = answer_field(run_key(run_id), question_id)
        raw = await self._read("answer read", thread_id, self._keys.answers(thread_id), "HGET", field)
        return None if raw is None else raw.decode()

    async def settle_request(
        self, thread_id: str, run_id: str | None, question_id: str, *, holder_id: str | None = None
    ) -> bool:
        """See ``HumanAnswers.settle_request``: one script (``SETTLE``: write id, owner, fence,
        the pending request compared and cleared, the run's answer fields deleted, the feed)."""
        self._check_writable()
        marker, ttl = self._write_args(write_id())
        k, owner, run = self._keys, self._owner, run_key(run_id)
        keys = [*k.scope(thread_id), k.answers(thread_id), k.leases(owner), k.changes, marker]

        async def attempt() -> bool:
            now = now_arg()
            args = [thread_id, owner, run, question_id, answer_prefix(run), holder_id or "", now, ttl]
            reply = await self._script("SETTLE", keys, args)
            if reply[0] == b"unavailable":
                self._unavailable(thread_id)
            if reply[0] == b"lease":
                self._lease_lost(thread_id, holder_id or "", reply[1], now)
            return reply[1] == b"1"

        return await self._call("settle", attempt)

    # --- change notification ---------------------------------------------------------------

    async def change_token(self) -> str:
        """See ``ChangeNotification.change_token``: the last id of the change feed (one
        ``XREVRANGE ... COUNT 1``); on the example's layout a digest of every thread's list
        length and extra value (one ``SCAN`` and a pipeline)."""
        client = self._live_client()
        if self._version is None:
            return await self._call("change check", lambda: self._foreign_token(client))

        async def last() -> str:
            newest = await client.xrevrange(self._keys.changes, "+", "-", count=1)
            return newest[0][0].decode() if newest else "0-0"

        return await self._call("change check", last)

    async def _foreign_token(self, client: Redis) -> str:
        tids = sorted(await read.scan_threads(client, self._keys))
        pipe = client.pipeline(transaction=False)
        for tid in tids:
            pipe.llen(self._keys.msgs(tid))
            pipe.get(self._keys.extra(tid))
        replies = await pipe.execute() if tids else []
        digest = hashlib.blake2b(digest_size=16)
        for i, tid in enumerate(tids):
            digest.update(repr((tid, replies[2 * i], replies[2 * i + 1])).encode())
        return digest.hexdigest()

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """See ``ChangeNotification.change_signals``: ``XREAD BLOCK`` on the change feed on a
        connection of its own, each block shorter than the socket timeout (at most
        ``BLOCK_MAX`` s, under a third of it); a read that times out anyway (a loaded
        server) is read again without a word. Changes within ``quiet_ms`` are one signal.
        On the example's layout the token is polled every ``FOREIGN_POLL`` s instead.
        Raises ``StoreConnectionError`` when the server stays unreachable."""
        if self._version is None:
            last_token = await self.change_token()
            while not await _stopped(stop, FOREIGN_POLL):
                token = await self.change_token()
                if token != last_token:
                    last_token = token
                    yield None
            return
        reader = Redis.from_url(
            self._client_url,
            socket_timeout=self._socket_timeout,
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
            client_name=f"{self._client_name}-changes",
        )
        block_ms = max(1, int(min(BLOCK_MAX, self._socket_timeout / 3) * 1000))
        feed = self._keys.changes

        async def newest() -> bytes:
            found = await reader.xrevrange(feed, "+", "-", count=1)
            return found[0][0] if found else b"0-0"

        async def next_batch(after: bytes) -> bytes | None:
            try:
                got = await reader.xread({feed: after}, block=block_ms)
            except RedisTimeoutError:
                return None  # slower than the socket timeout: read again, quietly
            if not got:
                return None
            return got[0][1][-1][0]

        reading: asyncio.Future[bytes | None] | None = None
        try:
            last = await self._call("change watch", newest)
            while not stop.is_set():
                reading = asyncio.ensure_future(self._call("change watch", lambda after=last: next_batch(after)))
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()
                if not reading.done():
                    return
                got, reading = reading.result(), None
                if got is None:
                    continue
                last = got
                if await _stopped(stop, quiet_ms / 1000):
                    return
                yield None
        finally:
            # The read must end before its client closes, also when this generator is
            # cancelled from outside: a read left running would see its connection closed
            # under it, report a reconnect that is not one, and open a new connection.
            if reading is not None:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
            await reader.aclose()


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``stop``; whether it was set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
