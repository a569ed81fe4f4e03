"""Reading threads from Redis: one thread (whole or after an id) and the thread listing.

Message ids are positions in the thread's list counting from 1 (the first message is
id 1), so ``load_after(thread, k)`` is ``LRANGE msgs k -1``; an undecodable entry is a
:class:`~core.checkpoint.base.CorruptRow` whose ``row_id`` is that same position, and is
never dropped or changed. ``version`` is the store's schema version (``None`` for a
store of CubePi's example layout, which has none of our keys). ``owner`` is the store's:
both reads run as scripts that check each thread's record against it on the server, so
another owner's thread reads exactly as a missing one.
"""

from __future__ import annotations

import json

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from core.checkpoint import codec
from core.checkpoint import redis_records as records
from core.checkpoint.base import CheckpointData, CorruptRow, ThreadSummary, parse_extra
from core.checkpoint.redis_keys import Keys
from core.errors import CorruptRecordError
from core.messages import AnyMessage, UserMessage

TAIL_WINDOW = 8
"""Entries read from the end of each thread for its tail; a thread whose last 8 hold no
assistant message is read whole (rare: a reply is followed by its tool results and a prompt)."""

_LIST_CHUNK = 500  # threads per pipeline round trip of a listing

FIRST_PROMPT_VERSION = 2
"""From this schema version on, ``tui:first`` holds each thread's first user prompt."""


def decode_rows(
    raws: list[bytes], thread_id: str, first_id: int
) -> tuple[list[AnyMessage], list[int], list[CorruptRow]]:
    """Decode list entries whose first has id ``first_id``: messages, their ids, undecodable rows."""
    ids = list(range(first_id, first_id + len(raws)))
    try:
        return codec.decode_many(raws), ids, []
    except CorruptRecordError:
        pass
    messages: list[AnyMessage] = []
    good: list[int] = []
    problems: list[CorruptRow] = []
    for row_id, raw in zip(ids, raws, strict=True):
        try:
            messages.append(codec.decode(raw, thread_id=thread_id, row_id=row_id))
            good.append(row_id)
        except CorruptRecordError as error:
            problems.append(CorruptRow(row_id, str(error), records.text(raw)))
    return messages, good, problems


async def load(
    r: Redis,
    script: AsyncScript,
    keys: Keys,
    owner: str,
    thread_id: str,
    version: int | None,
    after: int | None,
) -> CheckpointData | None:
    """The thread from one consistent view (the ``LOAD`` script), or ``None`` when it has
    nothing at all or is another owner's; with ``after`` only entries after that id (and
    never ``None``: empty data then)."""
    start = 0 if after is None else max(int(after), 0)
    reply = await script(keys=keys.scope(thread_id), args=[thread_id, owner, start], client=r)
    if not reply:
        return None if after is None else CheckpointData()
    raws, *parts = reply
    data, found = thread_parts(thread_id, version, *parts)
    if after is None and not raws and not found:
        return None
    data.messages, data.message_ids, problems = decode_rows(raws, thread_id, start + 1)
    data.problems[:0] = problems
    return data


def thread_parts(
    thread_id: str,
    version: int | None,
    extra_raw: bytes | None,
    runs_flat: list[bytes],
    pending_raw: bytes | None,
    journal_flat: list[bytes],
    record_flat: list[bytes],
) -> tuple[CheckpointData, bool]:
    """Everything :func:`load` reads of a thread but its messages, from the ``LOAD``
    script's reply after the list (extra, runs, pending request, journal, record), with the
    problems of an unreadable extra or record; and whether the thread has an extra, runs or
    a pending request."""
    runs = records.decode_runs(runs_flat)
    data = CheckpointData(runs=runs, pending_request=records.decode_pending(pending_raw))
    data.extra, problem = parse_extra(extra_raw, thread_id)
    if problem is not None:
        data.problems.append(problem)
    if version is not None:
        data.journal = {records.text(k): records.decode_journal(v) for k, v in records.pairs(journal_flat)}  # type: ignore[misc]
    data.extra_revision = records.extra_revision(record_flat)
    if record_flat:
        data.meta, unreadable = records.load_meta(thread_id, record_flat)
        if unreadable is not None:  # shown, kept; the thread still loads
            data.problems.append(unreadable)
    return data, extra_raw is not None or bool(runs) or pending_raw is not None


def _is_assistant(raw: bytes) -> bool:
    # Only an entry naming "assistant" somewhere can be one; json.loads confirms it is the role.
    if b"assistant" not in raw:
        return False
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("role") == "assistant"


def _tail_start(raws: list[bytes]) -> int | None:
    for i in range(len(raws) - 1, -1, -1):
        if _is_assistant(raws[i]):
            return i
    return None


def first_prompt_of(raws: list[bytes]) -> str | None:
    """The text of the first user message among ``raws`` (undecodable entries skipped), or ``None``."""
    for raw in raws:
        if b"user" not in raw:
            continue
        try:
            message = codec.decode(raw)
        except CorruptRecordError:
            continue
        if isinstance(message, UserMessage):
            return message.text
    return None


async def scan_threads(r: Redis, keys: Keys) -> set[str]:
    """Thread ids with a message list or an extra object (SCAN; for the example's layout)."""
    found: set[str] = set()
    for kind in ("msgs", "extra"):
        async for key in r.scan_iter(match=keys.pattern(kind), count=1000):
            found.add(keys.thread_of(key, kind))
    return found


def message_time(raw: bytes | None) -> float | None:
    """The ``timestamp`` field of a stored message (unix seconds), ``None`` when there is none."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    stamp = value.get("timestamp") if isinstance(value, dict) else None
    return float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None


async def _foreign_index(r: Redis, keys: Keys) -> list[tuple[str, float | None]]:
    """The example's threads with the time of their last message, most recent first."""
    tids = sorted(await scan_threads(r, keys))
    pipe = r.pipeline(transaction=False)
    for tid in tids:
        pipe.lindex(keys.msgs(tid), -1)
    lasts = await pipe.execute()
    found = [(tid, message_time(raw)) for tid, raw in zip(tids, lasts, strict=True)]
    found.sort(key=lambda pair: pair[1] or 0.0, reverse=True)
    return found


async def list_threads(
    r: Redis, keys: Keys, owner: str, version: int | None, chunk_script: AsyncScript
) -> list[ThreadSummary]:
    """Every thread of ``owner``, most recently active first (see ``Checkpointer.list_threads``).

    Ours: ``owner``'s listing index (:meth:`~core.checkpoint.redis_keys.Keys.index`: only
    its threads, so the cost and the time say nothing of other owners'), then one read-only
    script per 500 threads (``LIST_CHUNK`` of :mod:`~core.checkpoint.redis_scripts`: count,
    the last ``TAIL_WINDOW`` entries, runs, first prompt, lease, pending request, each
    thread's owner checked again in the script), so the cost is a few round trips whatever
    the number of threads. The example's layout: ``SCAN`` instead of the index, and the
    head of each thread for its first prompt (its threads record no owner: only the
    unowned scope sees them).
    """
    if version is None:
        index = await _foreign_index(r, keys)
    else:
        scored = await r.zrevrange(keys.index(owner), 0, -1, withscores=True)
        index = [(records.text(tid), score or None) for tid, score in scored]
    out: list[ThreadSummary] = []
    for at in range(0, len(index), _LIST_CHUNK):
        out.extend(await _summaries(r, keys, owner, version, index[at : at + _LIST_CHUNK], chunk_script))
    return out


async def _summaries(
    r: Redis,
    keys: Keys,
    owner: str,
    version: int | None,
    found: list[tuple[str, float | None]],
    chunk_script: AsyncScript,
) -> list[ThreadSummary]:
    tids = [tid for tid, _ in found]
    ours = version is not None
    cached_first = ours and version >= FIRST_PROMPT_VERSION  # type: ignore[operator]
    script_keys = [key for tid in tids for key in (keys.msgs(tid), keys.runs(tid), keys.record(tid))]
    replies = await chunk_script(
        keys=[*script_keys, keys.leases(owner), keys.pending, keys.first],
        args=[TAIL_WINDOW, "0" if cached_first else "1", owner, *tids],
        client=r,
    )
    # A thread whose record names another owner (deleted and made again since the index
    # was read) is left out, as the script said.
    kept = [i for i, reply in enumerate(replies) if reply != 0]
    index = [found[i] for i in kept]
    replies = [replies[i] for i in kept]
    tids = [tids[i] for i in kept]
    # A thread whose window held no assistant message (or, without the first-prompt
    # index, whose head held no user message) is read whole.
    whole_needed = [
        i
        for i, (count, window, *_rest, head) in enumerate(replies)
        if count > TAIL_WINDOW and (_tail_start(window) is None or (not cached_first and first_prompt_of(head) is None))
    ]
    wholes: dict[int, list[bytes]] = {}
    if whole_needed:
        pipe = r.pipeline(transaction=False)
        for i in whole_needed:
            pipe.lrange(keys.msgs(tids[i]), 0, -1)
        wholes = dict(zip(whole_needed, await pipe.execute(), strict=True))
    summaries: list[ThreadSummary] = []
    for i, (tid, activity) in enumerate(index):
        count, window, runs_flat, first_raw, lease_raw, pending_raw, head = replies[i]
        whole = wholes.get(i)
        rows, first_id = (whole, 1) if whole is not None else (window, max(count - len(window), 0) + 1)
        start = _tail_start(rows)
        tail_raws = rows if start is None else rows[start:]
        tail, _ids, problems = decode_rows(tail_raws, tid, first_id + (start or 0))
        if cached_first:
            first = records.text(first_raw) if first_raw is not None else ""
        else:
            first = first_prompt_of(whole if whole is not None else head) or ""
        runs = dict(zip(runs_flat[::2], runs_flat[1::2], strict=True))
        summaries.append(
            ThreadSummary(
                thread_id=tid,
                message_count=count,
                last_activity=activity,
                runs=tuple(records.decode_runs(runs)),
                tail=tuple(tail),
                problems=tuple(problems),
                first_prompt=first,
                lease=records.decode_lease(lease_raw) if ours else None,
                pending_request=records.decode_pending(pending_raw) if ours else None,
            )
        )
    return summaries
