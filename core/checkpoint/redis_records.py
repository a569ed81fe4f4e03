"""The JSON of each record the Redis store keeps in its hashes, both ways.

Times are unix seconds. Everything here is written by Python's ``json`` (exact for
ints, floats and nesting) and stored as that text; see :mod:`core.checkpoint.redis_scripts`
for why Lua never re-encodes it. Run records are the one kind Lua writes: all their
values are strings (``claimed_at``, ``n`` the claim order, ``completed_at``,
``completion_seq``), so ``cjson`` keeps them exact; a run's revision is 1 until it
completed, then 2 (what its two writes made of it). A thread's record and its step records
are hash fields (see :mod:`core.checkpoint.redis_keys`), read here from the flat
``HGETALL`` / ``HMGET`` replies the scripts return.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from core.checkpoint.base import (
    Command,
    CorruptRow,
    JobRecord,
    JournalEntry,
    Lease,
    PendingRequest,
    RunRecord,
    StepRecord,
    ThreadMeta,
    decode_thread_meta,
    load_thread_meta,
)
from core.checkpoint.redis_keys import STEP_FIELDS

_COMPACT = (",", ":")


def text(raw: bytes | str) -> str:
    """Stored bytes as ``str``; bytes that are not UTF-8 are kept (as lone surrogates)."""
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


def pairs(flat: Sequence[Any] | None) -> Iterator[tuple[Any, Any]]:
    """The ``(field, value)`` pairs of a flat ``HGETALL`` reply (``None``: none)."""
    items = flat or []
    return zip(items[::2], items[1::2], strict=True)


def dumps(value: Any) -> str:
    """Compact JSON; raises ``TypeError``/``ValueError`` for what JSON cannot hold."""
    return json.dumps(value, separators=_COMPACT)


def encode_lease(lease: Lease) -> str:
    """A lease as JSON (the fence in Lua reads ``holder_id`` and ``expires_at``)."""
    return dumps(asdict(lease))


def decode_lease(raw: bytes | str | None) -> Lease | None:
    """The lease in ``raw``, ``None`` for none."""
    return None if raw is None else Lease(**json.loads(raw))


def encode_journal(entry: JournalEntry) -> str:
    """A tool journal entry as JSON."""
    return dumps(asdict(entry))


def decode_journal(raw: bytes | str | None) -> JournalEntry | None:
    """The journal entry in ``raw``, ``None`` for none."""
    return None if raw is None else JournalEntry(**json.loads(raw))


def encode_job(record: JobRecord) -> str:
    """A job record as JSON; its ``result`` is already JSON-safe (checked by the caller)."""
    return dumps(asdict(record))


def decode_job(raw: bytes | str | None) -> JobRecord | None:
    """The job record in ``raw`` (a fresh copy of its result), ``None`` for none."""
    return None if raw is None else JobRecord(**json.loads(raw))


def encode_command(command: Command) -> str:
    """A command as JSON, without its ``seq`` (the hash field is the seq)."""
    data = asdict(command)
    del data["seq"]
    return dumps(data)


def decode_command(seq: int, raw: bytes | str) -> Command:
    """The command stored under ``seq``."""
    return Command(seq=seq, **json.loads(raw))


def encode_pending(request_json: str, run_id: str | None, created_at: float) -> str:
    """A pending human request: cubeloop's request text kept as a string, never re-parsed."""
    return dumps({"request_json": request_json, "run_id": run_id, "created_at": created_at})


def decode_pending(raw: bytes | str | None, *, answered: bool = False) -> PendingRequest | None:
    """The pending request in ``raw``, ``None`` for none; ``answered`` whether its answer is
    stored (read beside it by the same script: ``PENDING_OF``'s ``answer_stored``)."""
    if raw is None:
        return None
    data = json.loads(raw)
    return PendingRequest(str(data["request_json"]), data.get("run_id"), data.get("created_at"), answered)


def decode_runs(fields: dict[bytes, bytes] | Sequence[bytes]) -> list[RunRecord]:
    """Run records (an ``HGETALL`` of ``tui:runs:{thread}``, as a dict or flat) in claim order."""
    ordered: list[tuple[int, RunRecord]] = []
    for run_id, raw in fields.items() if isinstance(fields, dict) else pairs(fields):
        data = json.loads(raw)
        completed = data.get("completed_at")
        seq = data.get("completion_seq")
        ordered.append(
            (
                int(data.get("n", 0)),
                RunRecord(
                    run_id=text(run_id),
                    claimed_at=float(data["claimed_at"]),
                    completed_at=None if completed is None else float(completed),
                    completion_seq=None if seq is None else int(seq),
                    revision=1 if completed is None else 2,
                ),
            )
        )
    ordered.sort(key=lambda pair: pair[0])
    return [run for _, run in ordered]


def _record(thread_id: str, flat: Sequence[bytes] | None) -> tuple[Any, ...]:
    """The arguments of :func:`~core.checkpoint.base.decode_thread_meta` from the flat
    ``HGETALL`` of a thread's record: ``owner`` (none: unowned), ``created_at``, ``rev``
    (none: 0), the fingerprints ``fp`` and the overrides array ``ovr`` (none: none made)."""
    fields = {text(k): v for k, v in pairs(flat)}
    created = fields.get("created_at")
    owner = text(fields["owner"]) if "owner" in fields else None
    revision = int(fields.get("rev", 0))
    return thread_id, owner, None if created is None else float(created), revision, fields.get("fp"), fields.get("ovr")


def decode_meta(thread_id: str, flat: Sequence[bytes] | None) -> ThreadMeta:
    """A thread's record from the flat ``HGETALL`` of ``tui:rec:{thread}`` (empty for a
    thread that keeps none: unowned, revision 0); ``CorruptRecordError`` (one sentence) when
    its fingerprints or overrides cannot be read."""
    return decode_thread_meta(*_record(thread_id, flat))


def load_meta(thread_id: str, flat: Sequence[bytes] | None) -> tuple[ThreadMeta | None, CorruptRow | None]:
    """:func:`decode_meta` for ``load``: ``(record, None)``, or ``(None, the problem to
    show)`` when the record cannot be read (see :func:`~core.checkpoint.base.load_thread_meta`)."""
    return load_thread_meta(*_record(thread_id, flat))


def extra_revision(flat: Sequence[bytes] | None) -> int:
    """The extra's revision in the flat ``HGETALL`` of a thread's record (0: never saved by us)."""
    return next((int(v) for k, v in pairs(flat) if k == b"xrev"), 0)


def decode_step(thread_id: str, key: str, columns: Sequence[bytes | None]) -> StepRecord | None:
    """The step record of job ``key`` from its columns in the order of
    :data:`~core.checkpoint.redis_keys.STEP_FIELDS`; ``None`` when it was never begun."""
    fingerprint, workflow, next_step, total, revision, data, call, updated = columns
    if workflow is None or fingerprint is None:
        return None
    return StepRecord(
        thread_id=thread_id,
        key=key,
        input_fingerprint=text(fingerprint),
        workflow=text(workflow),
        next_step=int(next_step or 0),
        total_steps=None if total is None else int(total),
        revision=int(revision or 0),
        data=None if data is None else json.loads(data),
        tool_call_id=None if call is None else text(call),
        updated_at=float(updated or 0.0),
    )


def decode_steps(thread_id: str, flat: Sequence[bytes] | None) -> list[StepRecord]:
    """Every step record in the flat ``HGETALL`` of ``tui:steps:{thread}``, by key."""
    letters = list(STEP_FIELDS)
    by_key: dict[str, list[bytes | None]] = {}
    for field, value in pairs(flat):
        letter, _, key = text(field).partition(":")
        if letter in STEP_FIELDS:
            by_key.setdefault(key, [None] * len(letters))[letters.index(letter)] = value
    found = (decode_step(thread_id, key, columns) for key, columns in sorted(by_key.items()))
    return [record for record in found if record is not None]
