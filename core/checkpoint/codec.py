"""The one serializer: messages to JSON text and back, shared by every backend.

Encoding is ``model_dump(mode="json")`` as CubePi writes it, so rows stay readable by
cubeloop; decoding validates on ``role`` and keeps unknown fields. A row that cannot be
decoded raises :class:`~core.errors.CorruptRecordError`, never a raw pydantic or JSON error.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from pydantic import TypeAdapter, ValidationError

from core.errors import CorruptRecordError
from core.messages import AnyMessage, Message

_ADAPTER: TypeAdapter[AnyMessage] = TypeAdapter(Message)
_LIST_ADAPTER: TypeAdapter[list[AnyMessage]] = TypeAdapter(list[Message])


def encode(message: AnyMessage) -> str:
    """Serialize one message to compact JSON text (str)."""
    return message.model_dump_json()


def encode_extra(extra: dict[str, Any]) -> str:
    """Serialize a thread's extra object; raises ``TypeError`` for values JSON cannot hold."""
    return json.dumps(extra, separators=(",", ":"))


def decode(text: str | bytes, *, thread_id: str = "", row_id: object = None) -> AnyMessage:
    """Parse one stored message.

    Raises ``CorruptRecordError`` (with ``thread_id`` and ``row_id``) when ``text`` is not
    JSON, not an object, or not a valid message of its role.
    """
    try:
        return _ADAPTER.validate_json(text)
    except ValidationError as exc:
        raise CorruptRecordError(_why(exc, thread_id, row_id), thread_id=thread_id, row_id=row_id) from None


def decode_many(texts: Sequence[str | bytes]) -> list[AnyMessage]:
    """Parse many stored messages at once (one validator call, the fast path for loads).

    Raises ``CorruptRecordError`` if any row is bad; callers then fall back to
    :func:`decode` per row to find which.
    """
    try:
        return _LIST_ADAPTER.validate_json(b"[" + b",".join(_as_bytes(t) for t in texts) + b"]")
    except ValidationError as exc:
        raise CorruptRecordError(_why(exc, "", None), thread_id="", row_id=None) from None


def copy_message(message: AnyMessage) -> AnyMessage:
    """A deep copy, so stores never share mutable state with their callers."""
    return message.model_copy(deep=True)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def _why(exc: ValidationError, thread_id: str, row_id: object) -> str:
    first = exc.errors()[0] if exc.errors() else {"msg": str(exc)}
    kind = "malformed JSON" if first.get("type") == "json_invalid" else f"an invalid message ({first.get('msg')})"
    where = f"row {row_id} of thread {thread_id!r}" if row_id is not None else "a stored row"
    return f"{where[0].upper()}{where[1:]} holds {kind}; it is shown raw and left unchanged."
