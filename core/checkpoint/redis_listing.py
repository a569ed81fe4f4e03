"""The Redis thread listing: summaries decoding only each thread's tail, and thread versions.

Ours: the owner's listing index (:meth:`~core.checkpoint.redis_keys.Keys.index`: only its
threads, so the cost and the time say nothing of other owners'), then one read-only script
per 500 threads (``LIST_CHUNK`` of :mod:`~core.checkpoint.redis_scripts`), which checks
each thread's owner and finds its last assistant entry on the server - walking back from
the end a window at a time, an entry's role confirmed by ``cjson`` only when the entry
names it - and returns only the entries from there on: they are the only ones decoded.
(The earlier listing fetched and parsed the last eight entries of every thread in Python.)
The first prompt is the text our writes keep in ``tui:first`` (schema v2); a store without
it (the example's layout, or ours before v2) gets the first user entry from the script,
read by :func:`core.checkpoint.listing.stored_prompt_text` (decoded only where that rule cannot
vouch for it).

Thread versions (``VERSIONS_CHUNK``): a digest of the index score (last activity), the
list's length, the runs and the total length of their records (a completion lengthens its
record), the lease and pending request as stored, the record's revisions, whether an
extra exists and whether the pending request's answer is stored - what every write that
changes a summary leaves behind - no entry read, one string back per 500 threads.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Hashable

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from core.checkpoint import codec
from core.checkpoint import redis_records as records
from core.checkpoint.base import CorruptRow, ThreadSummary
from core.checkpoint.listing import in_listing_order, prompt_line, stored_prompt_text, tail_from
from core.checkpoint.redis_keys import Keys
from core.checkpoint.redis_read import TAIL_WINDOW, decode_rows, first_prompt_of, message_time, scan_threads
from core.errors import CorruptRecordError
from core.messages import AnyMessage, UserMessage

FIRST_PROMPT_VERSION = 2
"""From this schema version on, ``tui:first`` holds each thread's first user prompt."""

_CHUNK = 500  # threads per script call of a listing or a versions read

Index = list[tuple[str, float | None]]
"""Thread ids with their last activity (unix seconds, ``None`` unknown), most recent first."""


async def _foreign_index(r: Redis, keys: Keys) -> Index:
    """The example's threads with the time of their last message, most recent first."""
    tids = sorted(await scan_threads(r, keys))
    pipe = r.pipeline(transaction=False)
    for tid in tids:
        pipe.lindex(keys.msgs(tid), -1)
    lasts = await pipe.execute()
    found = [(tid, message_time(raw)) for tid, raw in zip(tids, lasts, strict=True)]
    found.sort(key=lambda pair: pair[1] or 0.0, reverse=True)
    return found


async def _index(r: Redis, keys: Keys, owner: str, version: int | None, among: Collection[str] | None) -> Index:
    """The threads to summarise: ``owner``'s listing index (or, for the example's layout,
    what ``SCAN`` finds), only those named in ``among`` when given."""
    if version is None:
        found = await _foreign_index(r, keys)
        return found if among is None else [pair for pair in found if pair[0] in among]
    if among is None:
        scored = await r.zrevrange(keys.index(owner), 0, -1, withscores=True)
        return [(records.text(tid), score or None) for tid, score in scored]
    named = sorted(set(among))
    scores = await r.zmscore(keys.index(owner), named) if named else []
    return [(tid, score or None) for tid, score in zip(named, scores, strict=True) if score is not None]


async def summaries(
    r: Redis, keys: Keys, owner: str, version: int | None, chunk_script: AsyncScript, among: Collection[str] | None
) -> list[ThreadSummary]:
    """Every thread of ``owner`` (only those named in ``among``, when given), most recently
    active first (see ``Checkpointer.list_threads`` and the module docstring)."""
    index = await _index(r, keys, owner, version, among)
    out: list[ThreadSummary] = []
    # One pause of the collector for the whole listing (see codec.gc_paused).
    with codec.gc_paused():
        for at in range(0, len(index), _CHUNK):
            out.extend(await _summaries(r, keys, owner, version, index[at : at + _CHUNK], chunk_script))
        return in_listing_order(out)


async def _summaries(
    r: Redis, keys: Keys, owner: str, version: int | None, found: Index, chunk_script: AsyncScript
) -> list[ThreadSummary]:
    tids = [tid for tid, _ in found]
    ours = version is not None
    cached_first = ours and version >= FIRST_PROMPT_VERSION  # type: ignore[operator]
    script_keys = [key for tid in tids for key in (keys.msgs(tid), keys.runs(tid), keys.record(tid), keys.answers(tid))]
    replies = await chunk_script(
        keys=[*script_keys, keys.leases(owner), keys.pending, keys.first],
        args=[TAIL_WINDOW, "0" if cached_first else "1", owner, *tids],
        client=r,
    )
    summaries: list[ThreadSummary] = []
    for (tid, activity), reply in zip(found, replies, strict=True):
        if reply == 0:
            # Its record names another owner (deleted and made again since the index was read).
            continue
        count, start, raws, runs_flat, first_raw, lease_raw, pending_raw, head, answered = reply
        tail, problems = await _tail(r, keys, tid, int(start), raws)
        if cached_first:
            first = prompt_line(records.text(first_raw)) if first_raw is not None else ""
        else:
            first = await _first_prompt(r, keys, tid, head)
        summaries.append(
            ThreadSummary(
                thread_id=tid,
                message_count=count,
                last_activity=activity,
                runs=tuple(records.decode_runs(runs_flat)),
                tail=tuple(tail),
                problems=tuple(problems),
                first_prompt=first,
                lease=records.decode_lease(lease_raw) if ours else None,
                pending_request=records.decode_pending(pending_raw, answered=bool(answered)) if ours else None,
            )
        )
    return summaries


async def _tail(
    r: Redis, keys: Keys, thread_id: str, start: int, raws: list[bytes]
) -> tuple[list[AnyMessage], list[CorruptRow]]:
    """The tail from list index ``start`` (the last assistant entry, or 0 with none:
    ``raws`` are the entries from there on), decoded (ids count from 1). When the stored
    assistant entry does not decode, the entries before it are read and the assistant entry
    before it looked for, again and again (rare: the script only checked the role)."""
    messages, ids, problems = decode_rows(raws, thread_id, start + 1)
    if not start or tail_from(messages, ids, problems, start + 1) is not None:
        return messages, problems
    head = await r.lrange(keys.msgs(thread_id), 0, start - 1)
    while True:
        earlier = next((i for i in range(start - 1, -1, -1) if _is_assistant(head[i])), None)
        begin = earlier or 0
        more, more_ids, more_problems = decode_rows(head[begin:start], thread_id, begin + 1)
        messages, problems = more + messages, more_problems + problems
        if earlier is None or tail_from(more, more_ids, more_problems, begin + 1) is not None:
            return messages, problems
        start = begin


def _is_assistant(raw: bytes) -> bool:
    # As the script's has_role: only an entry naming "assistant" can be one; json confirms the role.
    if b"assistant" not in raw:
        return False
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("role") == "assistant"


async def _first_prompt(r: Redis, keys: Keys, thread_id: str, head: list[bytes]) -> str:
    """The first prompt line of a thread without ``tui:first``: from the first user entry
    the script found (``head``: its list index and text, or empty), read by
    :func:`~core.checkpoint.listing.stored_prompt_text`; decoded where that rule cannot vouch for
    it; and when it does not decode, the first user message that does, from the whole
    list (as the store has always read it)."""
    if not head:
        return ""
    raw = head[1]
    text = stored_prompt_text(raw)
    if text is None:
        try:
            message = codec.decode(raw)
        except CorruptRecordError:
            message = None
        if isinstance(message, UserMessage):
            text = message.text
        else:
            text = first_prompt_of(await r.lrange(keys.msgs(thread_id), int(head[0]) + 1, -1))
    return "" if text is None else prompt_line(text)


async def thread_versions(
    r: Redis, keys: Keys, owner: str, version: int | None, versions_script: AsyncScript
) -> dict[str, Hashable]:
    """Every thread :func:`summaries` lists, by id, with its version (see the module
    docstring): the index, then one read-only script per 500 threads; on the example's
    layout ``SCAN`` and each list's length and extra."""
    if version is None:
        tids = sorted(await scan_threads(r, keys))
        pipe = r.pipeline(transaction=False)
        for tid in tids:
            pipe.llen(keys.msgs(tid))
            pipe.exists(keys.extra(tid))
        found = await pipe.execute() if tids else []
        return {tid: (found[2 * i], found[2 * i + 1]) for i, tid in enumerate(tids)}
    tids = [records.text(tid) for tid in await r.zrange(keys.index(owner), 0, -1)]
    out: dict[str, Hashable] = {}
    for at in range(0, len(tids), _CHUNK):
        part = tids[at : at + _CHUNK]
        script_keys = [
            k
            for tid in part
            for k in (keys.msgs(tid), keys.runs(tid), keys.record(tid), keys.extra(tid), keys.answers(tid))
        ]
        reply = await versions_script(
            keys=[*script_keys, keys.leases(owner), keys.pending, keys.index(owner)], args=[owner, *part], client=r
        )
        for tid, found in zip(part, records.text(reply).split(" "), strict=True):
            if found != "-":
                out[tid] = found
    return out
