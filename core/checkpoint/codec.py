"""The one serializer: messages to JSON text and back, shared by every backend.

Encoding is ``model_dump(mode="json")`` as CubePi writes it, so rows stay readable by
cubeloop; decoding validates on ``role`` and keeps unknown fields. A row that cannot be
decoded raises :class:`~core.errors.CorruptRecordError`, never a raw pydantic or JSON error.

Undecodable bytes: text decoded with ``errors="surrogateescape"`` (``os.fsdecode``, a
subprocess's output) keeps each undecodable byte as a lone surrogate (``b"\\xff"`` becomes
``"\\udcff"``), which UTF-8 cannot encode. Such a message is written with each lone
surrogate as its JSON escape (the six ASCII characters ``\\udcff``), exactly as cubeloop's
``json.dumps`` writes it, so the row is valid UTF-8 JSON and decoding gives back the exact
``str`` (``.encode("utf-8", "surrogateescape")`` then gives back the original bytes). The one
loss JSON forces: a high and a low surrogate held as two separate code points read back as
the one character they encode.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from core.checkpoint.base import CorruptRow
from core.errors import CorruptRecordError
from core.messages import AnyMessage, Message, reported_errors

_ADAPTER: TypeAdapter[AnyMessage] = TypeAdapter(Message)
# The validator's own methods: TypeAdapter's Python wrappers cost ~7 % of decoding a row.
_validate_json = _ADAPTER.validator.validate_json
_validate_python = _ADAPTER.validator.validate_python

RowId = TypeVar("RowId")

_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON \\uXXXX escape of a surrogate; the fast validator (jiter) refuses a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def encode(message: AnyMessage) -> str:
    """Serialize one message to compact JSON text (a ``str`` that encodes as valid UTF-8).

    Lone surrogates are written as JSON ``\\uXXXX`` escapes (see the module docstring);
    every other character is written as itself. Raises ``TypeError``/``ValueError`` only for
    a value pydantic cannot serialize at all.
    """
    try:
        return message.model_dump_json()
    except PydanticSerializationError:
        # The only failure of a valid message: a str UTF-8 cannot encode (lone surrogates),
        # in a value or in a key of free-form JSON (``details``, ``metadata``), where even
        # ``model_dump(mode="json")`` fails. So each lone surrogate is swapped for a marker
        # no text holds, the message is written as usual, and each marker becomes the
        # surrogate's \\uXXXX escape (inside a JSON string it stands for exactly that code point).
        marker = _marker(message)
        data = _swap_surrogates(message.model_dump(), marker)
        text = to_json(data).decode()
        return re.sub(re.escape(marker) + "([0-9a-f]{4})", lambda m: "\\u" + m.group(1), text)


def _marker(message: AnyMessage) -> str:
    # Random, and checked against the message's own text: a marker the message already
    # holds would turn its text into a surrogate on the way back.
    seen = repr(message.model_dump())
    while True:
        marker = f"@@cubepi-surrogate-{secrets.token_hex(8)}:"
        if marker not in seen:
            return marker


def _swap_surrogates(value: Any, marker: str) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub(lambda m: f"{marker}{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        return {_swap_surrogates(k, marker): _swap_surrogates(v, marker) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_swap_surrogates(v, marker) for v in value]
    return value


def encode_extra(extra: dict[str, Any]) -> str:
    """Serialize a thread's extra object; raises ``TypeError`` for values JSON cannot hold."""
    return json.dumps(extra, separators=(",", ":"))


def decode(text: str | bytes, *, thread_id: str = "", row_id: object = None) -> AnyMessage:
    """Parse one stored message.

    Raises ``CorruptRecordError`` (with ``thread_id`` and ``row_id``) when ``text`` is not
    JSON, not an object, or not a valid message of its role.
    """
    try:
        return _validate_json(text)  # type: ignore[no-any-return]
    except ValidationError as exc:
        if _has_surrogate_escape(text):
            try:
                return _ADAPTER.validate_python(json.loads(text))
            except (ValueError, ValidationError):
                pass  # reported below with the fast validator's reason
        raise CorruptRecordError(_why(exc, thread_id, row_id), thread_id=thread_id, row_id=row_id) from None


def decode_value(value: object, *, thread_id: str = "", row_id: object = None) -> AnyMessage:
    """Validate one stored message already parsed from its wire form (a dict unpacked from
    msgpack, as cubeloop's Postgres store keeps them). Raises ``CorruptRecordError`` (with
    ``thread_id`` and ``row_id``) when it is not a valid message of its role."""
    try:
        return _validate_python(value)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise CorruptRecordError(_why(exc, thread_id, row_id), thread_id=thread_id, row_id=row_id) from None


def decode_rows(
    rows: Iterable[tuple[RowId, str | bytes]], thread_id: str, shown: Callable[[Any], str]
) -> tuple[list[AnyMessage], list[RowId], list[CorruptRow]]:
    """Decode ``(row id, stored text)`` pairs in order: ``(messages, their row ids, problems)``,
    where each row that is not a message becomes a :class:`~core.checkpoint.base.CorruptRow`
    holding :func:`decode`'s reason and ``shown(raw)``; never raises for a bad row.

    One validator call per row, with the collector paused (:func:`gc_paused`). Measured
    against one call for the whole list (``list[Json[Message]]``): within 2 % of the
    instructions, and a call per row lets the event loop have the GIL between rows when this
    runs on a connection's thread. Rows are never joined into one JSON text: a row ending
    inside an object could then merge with the next into a message neither holds.
    """
    messages: list[AnyMessage] = []
    ids: list[RowId] = []
    problems: list[CorruptRow] = []
    with gc_paused():
        for row_id, raw in rows:
            try:
                messages.append(_validate_json(raw))
            except ValidationError:
                try:  # decode again, for its surrogate escapes and its reason
                    messages.append(decode(raw, thread_id=thread_id, row_id=row_id))
                except CorruptRecordError as exc:
                    problems.append(CorruptRow(row_id, str(exc), shown(raw)))
                    continue
            ids.append(row_id)
    return messages, ids, problems


def copy_message(message: AnyMessage) -> AnyMessage:
    """A deep copy, so stores never share mutable state with their callers."""
    return message.model_copy(deep=True)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def _has_surrogate_escape(text: str | bytes) -> bool:
    try:
        return _SURROGATE_ESCAPE.search(_as_bytes(text)) is not None
    except UnicodeEncodeError:  # a str holding a raw lone surrogate: no JSON we wrote
        return False


def _why(exc: ValidationError, thread_id: str, row_id: object) -> str:
    errors = reported_errors(exc.errors())
    first: dict[str, Any] = dict(errors[0]) if errors else {"msg": str(exc)}
    kind = "malformed JSON" if first.get("type") == "json_invalid" else f"an invalid message ({first.get('msg')})"
    where = f"row {row_id} of thread {thread_id!r}" if row_id is not None else "a stored row"
    return f"{where[0].upper()}{where[1:]} holds {kind}; it is shown raw and left unchanged."


_pause_lock = threading.Lock()
_pauses = 0  # gc_paused blocks running now, in any thread (the collector's switch is the process's)
_resume = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while decoding many rows (every backend's loads),
    then move what survived into the oldest generation instead of collecting it.

    Decoding 10,000 messages makes ~77,000 tracked containers (models, their field dicts and
    field-name sets, content lists). With the collector on, every 700 start a young
    collection that walks all young survivors (measured: ~115 ms with the collector paused
    against ~390 ms without). Paused, they are all young when the load ends: the first
    allocation after it walks them once and a later middle-generation collection walks them
    again, yet they are kept by whoever loaded them, so those walks only ever move them
    along. ``gc.freeze()`` then ``gc.unfreeze()`` puts every tracked object in the oldest
    generation at once (what ``unfreeze`` is documented to do), where full collections
    examine them as before. Measured (``bench/bench_load.py``, 10,000 messages, CPU ms,
    medians): collector time inside the load 34-39 -> 0.7, inside the next operation
    (~50,000 allocations) 47-55 -> 1.2, a full collection after 86-89 -> 71-77. The cost: a
    garbage cycle made by any thread just before or during the pause waits for the next full
    collection instead of a young one. Skipped when something else froze objects
    (``gc.get_freeze_count()``), so that freeze stays as it was.

    Nests and overlaps across threads: the collector stays off until the last block ends,
    and is turned on again only if it was on when the first began.
    """
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0:
                if gc.get_freeze_count() == 0:
                    gc.freeze()
                    gc.unfreeze()
                if _resume:
                    gc.enable()
