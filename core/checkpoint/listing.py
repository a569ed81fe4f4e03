"""What every backend's thread listing shares: the first prompt's line, the prompt read
without decoding its row, the tail, the order, and thread versions.

The picker lists 10,000 threads; decoding a row (a pydantic validation) is what such a
listing costs (issue 10's profile: 810 ms of 1,240 on eight tail rows per thread). So a
backend finds each thread's last assistant row by its stored role, decodes only the tail
from there (usually 1-3 rows), and reads the first prompt's text from the stored value
with :func:`prompt_text`, which answers only where the value surely validates as a
:class:`~core.messages.UserMessage` and gives exactly its ``text`` (else ``None``: the
caller decodes the row, as before). The rule is written once, as data
(:data:`MESSAGE_FIELDS`, :data:`BLOCK_FIELDS`, :data:`REQUIRED_BLOCK_FIELDS`), checked on
the parsed value; a row stored as JSON text is parsed as the decoder parses it
(:func:`stored_prompt_text`).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from pydantic_core import from_json

from core.checkpoint import codec
from core.checkpoint.base import CorruptRow, ThreadSummary
from core.messages import AnyMessage, AssistantMessage

FIRST_PROMPT_CHARS = 200
"""``ThreadSummary.first_prompt`` is cut to this many characters (whitespace collapsed)."""

ThreadVersion = Hashable
"""A thread's version as ``ThreadVersions.thread_versions`` gives it: only compared for equality."""

# The JSON types (named as SQLite's json_type names them) each field may hold for pydantic to accept it
# as it is: a subset of what validates (a JSON number for a float, a string for a str...),
# never more, so a value of another type is left to the decoder. From core/messages.py.
_TEXT = ("text",)
_TEXT_OR_NULL = ("text", "null")

MESSAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "timestamp": ("integer", "real", "null"),  # float | None
    "metadata": ("object",),  # dict[str, Any]
    "run_id": _TEXT_OR_NULL,
    "id": _TEXT,
}
"""A user message's fields besides ``role`` and ``content``, by the JSON types it may hold
(absent: the default). Others are kept as they are (``extra="allow"``)."""

BLOCK_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "text": {"text": _TEXT},
    "thinking": {"thinking": _TEXT, "signature": _TEXT_OR_NULL},
    # ImageContent also reads cubeloop's source / media_type, of any type (kept when not text).
    "image": {"data": _TEXT, "mime_type": _TEXT},
    "tool_call": {"id": _TEXT, "name": _TEXT, "arguments": ("object",), "arguments_error": _TEXT_OR_NULL},
}
"""The known content blocks' fields by the JSON types each may hold (absent: the default);
a block of another ``type`` (a string) is an ``UnknownContent``, which takes anything else."""

REQUIRED_BLOCK_FIELDS: dict[str, tuple[str, ...]] = {"tool_call": ("id", "name")}
"""Block fields without a default: a block lacking one does not validate."""

TEXT_JOINER = "\n"
"""How ``UserMessage.text`` joins its text blocks."""


# What a parser gives, by its exact class (bool is not here: its two values have two names).
_EXACT_TYPES: dict[type, str] = {
    type(None): "null",
    int: "integer",
    float: "real",
    str: "text",
    list: "array",
    dict: "object",
}


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value, as SQLite's ``json_type`` names it (``"blob"``
    for what JSON has no type for: bytes from msgpack, say)."""
    exact = _EXACT_TYPES.get(type(value))
    if exact is not None:  # one lookup for what a parser gives; subclasses by isinstance below
        return exact
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "blob"


def stored_role(value: Any) -> Any:
    """The ``role`` of a stored message given as its parsed value (``None`` when it is not
    an object or has none): what the decoder routes it on."""
    return value.get("role") if isinstance(value, dict) else None


def _exact_classes(kinds: tuple[str, ...]) -> frozenset[type]:
    """The classes of :data:`_EXACT_TYPES` whose JSON type is in ``kinds``."""
    return frozenset(cls for cls, name in _EXACT_TYPES.items() if name in kinds)


# The rule's tables with, for each field, the exact classes a parser gives for the JSON types
# it allows: for a value of a class in _EXACT_TYPES, ``type(v) in exact`` is exactly
# ``json_type(v) in kinds``; json_type is called only for other classes. Measured (callgrind,
# a typical first prompt): the rule ~16,700 -> ~11,600 instructions, a call fewer per field.
_MESSAGE_CHECKS = tuple((name, kinds, _exact_classes(kinds)) for name, kinds in MESSAGE_FIELDS.items())
_BLOCK_CHECKS = {
    kind: tuple(
        (name, kinds, _exact_classes(kinds), name in REQUIRED_BLOCK_FIELDS.get(kind, ()))
        for name, kinds in fields.items()
    )
    for kind, fields in BLOCK_FIELDS.items()
}


def prompt_text(value: Any) -> str | None:
    """The ``text`` of a stored user message given as its parsed value (a dict from JSON or
    msgpack), without validating it: the text blocks joined with newlines (or the string
    content), when every field holds a type :data:`MESSAGE_FIELDS` and :data:`BLOCK_FIELDS`
    allow. ``None`` when the value is not such a user message, or may not validate: the
    caller then decodes the row (a row that does not decode has no prompt)."""
    if stored_role(value) != "user":
        return None
    for name, kinds, exact in _MESSAGE_CHECKS:
        if name in value:
            field = value[name]
            if type(field) not in exact and (type(field) in _EXACT_TYPES or json_type(field) not in kinds):
                return None
    content = value.get("content", [])
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            return None
        for name, kinds, exact, required in _BLOCK_CHECKS.get(kind, ()):
            if name in block:
                field = block[name]
                if type(field) not in exact and (type(field) in _EXACT_TYPES or json_type(field) not in kinds):
                    return None
            elif required:
                return None
        if kind == "text":
            texts.append(block.get("text", ""))
    return TEXT_JOINER.join(texts)


NOT_JSON = object()
"""What :func:`stored_value` gives for a row the decoder would not read as JSON."""


def stored_value(raw: str | bytes) -> Any:
    """A message stored as JSON text ``raw`` (a row's value), parsed as the decoder
    (:func:`core.checkpoint.codec.decode`) parses it: pydantic's own JSON parser (the same
    values: the last of duplicate keys, ``NaN``, its depth limit), and, for a row that
    parser refuses while it holds JSON escapes of lone surrogates, Python's ``json`` (the
    decoder's second reading). :data:`NOT_JSON` when the decoder would not read it as JSON."""
    try:
        return from_json(raw)
    except ValueError:
        # The decoder's own test, not a copy of it (codec.py is the serializer's one place).
        if not codec._has_surrogate_escape(raw):
            return NOT_JSON
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return NOT_JSON


def stored_prompt_text(raw: str | bytes) -> str | None:
    """:func:`prompt_text` of a message stored as JSON text ``raw``, parsed by
    :func:`stored_value`. ``None`` when the decoder would not read the row as JSON, or the
    rule cannot vouch for it (the caller decodes the row).

    Measured (10,000 first prompts of ~190 bytes, CPU, loaded machine): ~3 us a row,
    against ~9.6 us to decode it, and ~9.6 us for the rule rendered in SQL with SQLite's
    JSON functions (the SQLite listing's earlier reading, the row's seek included)."""
    value = stored_value(raw)
    return None if value is NOT_JSON else prompt_text(value)


def prompt_line(text: str) -> str:
    """A first prompt as the picker shows it: whitespace collapsed to single spaces, cut to
    :data:`FIRST_PROMPT_CHARS` characters (the last one ``…`` when cut)."""
    line = " ".join(text.split())
    return line if len(line) <= FIRST_PROMPT_CHARS else line[: FIRST_PROMPT_CHARS - 1] + "…"


def tail_from(
    messages: Sequence[AnyMessage], ids: Sequence[Any], problems: Sequence[CorruptRow], start: Any
) -> tuple[list[AnyMessage], list[CorruptRow]] | None:
    """The tail of rows decoded from row id ``start`` on (``messages`` with their ``ids``,
    the undecodable rows in ``problems``): every message and problem from ``start``, when
    the row at ``start`` decoded as an assistant message; ``None`` when it did not (a row
    whose stored role is ``assistant`` that does not validate), so the caller looks
    further back for the one before."""
    if not messages or ids[0] != start or not isinstance(messages[0], AssistantMessage):
        return None
    return list(messages), list(problems)


def listing_key(summary: ThreadSummary) -> tuple[bool, float, str]:
    """The sort key of the listing order (sorted with ``reverse=True``): most recently
    active first, threads without a known time last, ties by thread id (descending)."""
    return (summary.last_activity is not None, summary.last_activity or 0.0, summary.thread_id)


def in_listing_order(summaries: Iterable[ThreadSummary]) -> list[ThreadSummary]:
    """``summaries`` in the order ``list_threads`` gives them (:func:`listing_key`), every backend's."""
    return sorted(summaries, key=listing_key, reverse=True)


def merge_listing(
    listing: Sequence[ThreadSummary], fresh: Iterable[ThreadSummary], gone: Iterable[str]
) -> list[ThreadSummary]:
    """``listing`` with the summaries in ``fresh`` replacing (or joining) those of the same
    thread and the threads named in ``gone`` removed, in listing order (:func:`in_listing_order`)."""
    by_id = {s.thread_id: s for s in listing}
    for tid in gone:
        by_id.pop(tid, None)
    by_id.update((s.thread_id, s) for s in fresh)
    return in_listing_order(by_id.values())


def changed_threads(before: dict[str, ThreadVersion], after: dict[str, ThreadVersion]) -> tuple[set[str], set[str]]:
    """``(moved, gone)`` between two ``thread_versions`` readings: the threads new or whose
    version differs, and those no longer there."""
    moved = {tid for tid, version in after.items() if before.get(tid) != version}
    return moved, set(before) - set(after)
