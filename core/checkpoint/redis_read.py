"""Reading threads from Redis: one thread (whole or after an id); the listing is :mod:`core.checkpoint.redis_listing`.

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
from core.checkpoint.base import CheckpointData, CorruptRow, parse_extra
from core.checkpoint.redis_keys import Keys
from core.errors import CorruptRecordError
from core.messages import AnyMessage, UserMessage

TAIL_WINDOW = 8
"""Entries read at a time from either end of a list, by the listing's script (its tail,
walking back; its first user entry, on a store without ``tui:first``) and by the v2 upgrade."""


def decode_rows(
    raws: list[bytes], thread_id: str, first_id: int
) -> tuple[list[AnyMessage], list[int], list[CorruptRow]]:
    """Decode list entries whose first has id ``first_id``: messages, their ids, undecodable
    rows (:func:`~core.checkpoint.codec.decode_rows`)."""
    return codec.decode_rows(enumerate(raws, start=first_id), thread_id, records.text)


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
    reply = await script(
        keys=[*keys.scope(thread_id), keys.answers(thread_id)], args=[thread_id, owner, start], client=r
    )
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
    answered: int,
) -> tuple[CheckpointData, bool]:
    """Everything :func:`load` reads of a thread but its messages, from the ``LOAD``
    script's reply after the list (extra, runs, pending request, journal, record, whether
    the request's answer is stored), with the problems of an unreadable extra or record;
    and whether the thread has an extra, runs or a pending request."""
    runs = records.decode_runs(runs_flat)
    data = CheckpointData(runs=runs, pending_request=records.decode_pending(pending_raw, answered=bool(answered)))
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
