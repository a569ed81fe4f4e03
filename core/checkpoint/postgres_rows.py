"""Rows of cubeloop's Postgres tables to our records and back: the wire format of ``cubepi_messages``.

A message row is written as cubeloop 0.15.3 writes it (``PostgresCheckpointer.append``):
``role`` is ``user`` / ``assistant`` / ``tool`` (cubeloop's column names a tool result
``tool``), ``metadata`` the message's metadata as JSONB, ``payload`` msgpack of
``model_dump(mode="json")`` with ``use_bin_type=True``. A message of a role this version
does not know keeps its own role in the column (cubeloop cannot read such a row anyway).

Reading follows cubeloop's ``_deserialize_row``: the ``metadata`` column is the source of
truth for ``metadata``. Two exceptions keep our rows exact: a payload without a
``metadata`` key gets none added when the column is empty (an unknown message stays as
it was), and text JSONB cannot hold (NUL, lone surrogates) is written to the column
replaced by U+FFFD, while the payload keeps the original, which is read back when the
column is that replaced form of it.

Lone surrogates (bytes kept by ``surrogateescape``, see :mod:`core.checkpoint.codec`) have
no strict UTF-8 form, so such a payload is packed with ``surrogatepass`` and unpacked the
same way; cubeloop's strict unpacker reports that row as corrupt instead of losing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from core.checkpoint import codec
from core.checkpoint.base import (
    CorruptRow,
    PendingRequest,
    RunRecord,
    StepRecord,
    ThreadMeta,
    decode_thread_meta,
    encode_fingerprints,
    encode_overrides,
)
from core.errors import CorruptRecordError
from core.messages import AnyMessage

_COLUMN_ROLE = {"user": "user", "assistant": "assistant", "tool_result": "tool"}
_PAYLOAD_ROLE = {"tool": "tool_result"}
_JSONB_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def role_column(message: AnyMessage) -> str:
    """The ``role`` column cubeloop expects for ``message``."""
    return _COLUMN_ROLE.get(message.role, message.role)


def encode_message(message: AnyMessage) -> tuple[str, str, bytes, str | None]:
    """``(role, metadata JSON text, payload, run_id)`` for one row of ``cubepi_messages``."""
    data = message.model_dump(mode="json")
    try:
        payload = msgpack.packb(data, use_bin_type=True)
    except UnicodeEncodeError:
        payload = msgpack.packb(data, use_bin_type=True, unicode_errors="surrogatepass")
    metadata = data.get("metadata") or {}
    return role_column(message), json.dumps(_jsonb_safe(metadata)), payload, getattr(message, "run_id", None)


def _jsonb_safe(value: Any) -> Any:
    if isinstance(value, str):
        return _JSONB_UNSAFE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_jsonb_safe(k): _jsonb_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonb_safe(v) for v in value]
    return value


def decode_rows(rows: Sequence[Any], thread_id: str) -> tuple[list[AnyMessage], list[int], list[CorruptRow]]:
    """Decode ``(seq, role, metadata, payload)`` rows in order; a row that fails becomes a ``CorruptRow``."""
    messages: list[AnyMessage] = []
    ids: list[int] = []
    problems: list[CorruptRow] = []
    with codec.gc_paused():
        for seq, role, metadata, payload in rows:
            try:
                messages.append(decode_row(thread_id, seq, role, metadata, payload))
            except CorruptRecordError as exc:
                problems.append(CorruptRow(seq, str(exc), _raw(payload)))
            else:
                ids.append(seq)
    return messages, ids, problems


def decode_row(thread_id: str, seq: int, role: str, metadata: str | None, payload: bytes) -> AnyMessage:
    """One row as a message; ``CorruptRecordError`` when its payload is not a message."""
    return codec.decode_value(row_value(thread_id, seq, role, metadata, payload), thread_id=thread_id, row_id=seq)


def row_value(thread_id: str, seq: int, role: str, metadata: str | None, payload: bytes) -> dict[str, Any]:
    """One row as the value :func:`decode_row` validates (the payload unpacked, its role and
    metadata as cubeloop reads them), not validated; ``CorruptRecordError`` when the payload
    is not msgpack of an object."""
    try:
        data = msgpack.unpackb(payload, raw=False, unicode_errors="surrogatepass")
    except Exception:  # msgpack raises several unrelated types for bad bytes
        raise CorruptRecordError(
            f"Row {seq} of thread {thread_id!r} holds a payload that is not msgpack; it is shown raw and left unchanged.",
            thread_id=thread_id,
            row_id=seq,
        ) from None
    if not isinstance(data, dict):
        raise CorruptRecordError(
            f"Row {seq} of thread {thread_id!r} holds a payload that is not a message; it is shown raw"
            " and left unchanged.",
            thread_id=thread_id,
            row_id=seq,
        )
    data.setdefault("role", _PAYLOAD_ROLE.get(role, role))
    column = json.loads(metadata) if metadata and metadata != "{}" else {}  # "{}": most rows, parsed for free
    if "metadata" in data:
        if column != data["metadata"] and _jsonb_safe(data["metadata"]) != column:
            data["metadata"] = column
    elif column:
        data["metadata"] = column
    return data


def _raw(payload: bytes) -> str:
    """A corrupt payload as text: its JSON view when it unpacks, else its bytes in hex."""
    try:
        return json.dumps(msgpack.unpackb(payload, raw=False, unicode_errors="surrogatepass"), default=repr)
    except Exception:
        return payload.hex()


def run_record(run_id: str, claimed: float | None, completed: float | None, seq: int | None) -> RunRecord:
    """A run row (times already unix seconds) as a record. cubeloop's runs table keeps no
    revision, and needs none: a run is written twice at most, so its revision is 1 while
    claimed and 2 once completed."""
    return RunRecord(run_id, claimed, completed, seq, revision=1 if completed is None else 2)


# --- thread records and steps (our tables, v3) --------------------------------------------------


RECORD_COLUMNS = ("owner", "created_at", "revision", "fingerprints", "overrides")
"""The thread record's columns :func:`~core.checkpoint.base.decode_thread_meta` takes after the thread id, in its order."""


def meta_json(meta: ThreadMeta) -> dict[str, Any]:
    """``meta`` as a JSON object (a write's kept result), read back by :func:`meta_of_json`;
    its fingerprints and overrides as the record's columns hold them (spaced JSON text)."""
    return {
        "thread_id": meta.thread_id,
        "owner": meta.owner,
        "created_at": meta.created_at,
        "revision": meta.revision,
        "fingerprints": None if meta.fingerprints is None else encode_fingerprints(meta.fingerprints, spaced=True),
        "overrides": encode_overrides(meta.overrides, spaced=True),
    }


def meta_of_json(value: dict[str, Any]) -> ThreadMeta:
    """The inverse of :func:`meta_json`."""
    return decode_thread_meta(**value)


STEP_COLUMNS = (
    "thread_id, key, input_fingerprint, workflow, next_step, total_steps, revision, data, tool_call_id, updated_at"
)
"""The ``cubepi_tui_steps`` columns :func:`step_record` reads, in its order."""


def step_record(row: Sequence[Any]) -> StepRecord:
    """A step row (:data:`STEP_COLUMNS`; ``data`` JSON text, ``NULL`` before the first commit) as its record."""
    thread_id, key, fingerprint, workflow, next_step, total, revision, data, call_id, updated = row
    value = None if data is None else json.loads(data)
    return StepRecord(thread_id, key, fingerprint, workflow, next_step, total, revision, value, call_id, updated)


def pending_request(
    jsonb_text: str | None,
    our_text: str | None,
    run_id: str | None,
    our_at: float | None,
    updated_at: float | None,
    answered: bool,
) -> PendingRequest | None:
    """The thread's pending request: our exact text when it still is what the row holds
    (``our_text`` is given only then), else the row's JSONB text as cubeloop wrote it, dated
    by its ``created_at`` (``HitlRequest.created_at``) or else the thread row's ``updated_at``;
    ``answered`` whether its answer is stored."""
    if jsonb_text is None:
        return None
    if our_text is not None:
        return PendingRequest(our_text, run_id, our_at, answered)
    try:
        asked = json.loads(jsonb_text).get("created_at")  # cubeloop's HitlRequest.created_at, unix seconds
    except (ValueError, AttributeError):
        asked = None
    at = float(asked) if isinstance(asked, (int, float)) and not isinstance(asked, bool) else updated_at
    return PendingRequest(jsonb_text, run_id, at, answered)


def pending_of(thread: Mapping[str, Any]) -> PendingRequest | None:
    """:func:`pending_request` of a thread row read with the pending columns (``pending``,
    ``our_text``, ``run_id``, ``our_at``, ``updated_at``, ``answered``), as the load and
    the listing both read them."""
    return pending_request(
        thread["pending"],
        thread["our_text"],
        thread["run_id"],
        thread["our_at"],
        thread["updated_at"],
        thread["answered"],
    )
