"""The JSON of each record the Redis store keeps in its hashes, both ways.

Times are unix seconds. Everything here is written by Python's ``json`` (exact for
ints, floats and nesting) and stored as that text; see :mod:`core.checkpoint.redis_scripts`
for why Lua never re-encodes it. Run records are the one kind Lua writes: all their
values are strings (``claimed_at``, ``n`` the claim order, ``completed_at``,
``completion_seq``), so ``cjson`` keeps them exact.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from core.checkpoint.base import Command, JobRecord, JournalEntry, Lease, PendingRequest, RunRecord

_COMPACT = (",", ":")


def text(raw: bytes | str) -> str:
    """Stored bytes as ``str``; bytes that are not UTF-8 are kept (as lone surrogates)."""
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


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


def decode_pending(raw: bytes | str | None) -> PendingRequest | None:
    """The pending request in ``raw``, ``None`` for none."""
    if raw is None:
        return None
    data = json.loads(raw)
    return PendingRequest(str(data["request_json"]), data.get("run_id"), data.get("created_at"))


def decode_runs(fields: dict[bytes, bytes]) -> list[RunRecord]:
    """Run records (an ``HGETALL`` of ``tui:runs:{thread}``) in claim order."""
    ordered: list[tuple[int, RunRecord]] = []
    for run_id, raw in fields.items():
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
                ),
            )
        )
    ordered.sort(key=lambda pair: pair[0])
    return [run for _, run in ordered]
