"""Skeletons: a message cut down to what a diagnosis reads, from a message or from its row.

:func:`core.recovery.diagnose` (through :class:`core.recovery_fold.HistoryFold` and the
request builder) reads of each message its class, run, stop reason and error, its tool
calls and the id of the call a result answers, and of each content block only whether it
would be sent. A skeleton is a message of the same class holding exactly that; the text,
images, timestamps and details a long thread is made of are left out, so a whole thread's
diagnosis can be made, and its open part kept, in a fraction of the memory.

:class:`SkeletonReader` reads skeletons straight from stored rows, without building the
full messages (issue 10: "the view decodes what it shows plus what diagnosis needs"). It
validates with the message schema itself - pydantic's own schema of
:data:`core.messages.Message`, each model's construction replaced by the reduction below -
so it accepts exactly the rows the store's decoder accepts; a row it refuses goes to that
decoder (:func:`~core.checkpoint.pages.read_rows`), which says why it is unreadable, in its
own words, or decodes it (JSON escapes of lone surrogates, which the fast path refuses).
``tests/core/test_recovery_fold.py`` checks that a row's skeleton read this way equals the
skeleton of its decoded message, and that diagnosing skeletons is diagnosing messages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter
from pydantic_core import SchemaValidator

from core.messages import (
    KNOWN_BLOCK_TYPES,
    AnyMessage,
    AssistantMessage,
    ContentBlock,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    Usage,
    UserMessage,
)
from core.request import blank, image_source

# Blocks shared by every skeleton (never changed: the builder copies messages it trims).
_TEXT = TextContent.model_construct(type="text", text="x")
_BLANK = TextContent.model_construct(type="text", text="")
_IMAGE = ImageContent.model_construct(type="image", data="x", mime_type="x")
_NO_IMAGE = ImageContent.model_construct(type="image", data="", mime_type="")
_THINKING = ThinkingContent.model_construct(type="thinking", thinking="", signature=None)
_UNKNOWN = UnknownContent.model_construct(type="unknown")
_NO_METADATA: dict[str, Any] = {}

# One empty message of each class, copied for each skeleton: ``model_construct`` costs
# ~50 us a call here (pydantic 2.14) and ``copy.copy`` ~15 us; setting the four slots
# pydantic's own ``__copy__`` sets, sharing the parts no skeleton changes (the set of fields
# set, the empty extra: ``model_copy``, the builder's only change, copies both), ~2 us.
_ASSISTANT = AssistantMessage.model_construct(timestamp=None)
_RESULT = ToolResultMessage.model_construct(tool_call_id="", timestamp=None)
_USER = UserMessage.model_construct(timestamp=None)
_UNKNOWN_ROLE = UnknownMessage.model_construct(role="unknown")
_set = object.__setattr__
_M = TypeVar("_M", AssistantMessage, ToolResultMessage, UserMessage, UnknownMessage)
_B = TypeVar("_B", bound=BaseModel)


def _made(template: _M, **fields: Any) -> _M:
    made = template.__class__.__new__(template.__class__)
    values = template.__dict__.copy()
    values.update(fields)
    _set(made, "__dict__", values)
    _set(made, "__pydantic_fields_set__", template.__pydantic_fields_set__)
    _set(made, "__pydantic_extra__", template.__pydantic_extra__)
    _set(made, "__pydantic_private__", None)
    return made


def _block(block: ContentBlock) -> ContentBlock:
    if isinstance(block, TextContent):
        return _BLANK if blank(block.text) else _TEXT
    if isinstance(block, ToolCall):
        return block  # a dangling call is shown and settled whole: id, name, arguments
    if isinstance(block, ImageContent):
        return _NO_IMAGE if image_source(block) is None else _IMAGE
    if isinstance(block, ThinkingContent):
        return _THINKING
    return _UNKNOWN


def _assistant(content: list[ContentBlock], message: dict[str, Any] | AssistantMessage) -> AssistantMessage:
    get = message.get if isinstance(message, dict) else message.__dict__.get
    calls = any(isinstance(b, ToolCall) for b in content)
    return _made(
        _ASSISTANT,
        content=content,
        stop_reason=get("stop_reason"),
        error_message=get("error_message"),
        run_id=get("run_id"),
        metadata=get("metadata") if calls else _NO_METADATA,
        usage=get("usage"),
    )


def _user_content(content: str | list[ContentBlock]) -> str | list[ContentBlock]:
    return ("" if blank(content) else "x") if isinstance(content, str) else content


def skeleton(message: AnyMessage) -> AnyMessage:
    """What a diagnosis reads of ``message``, as a message of the same class.

    Kept: the class (role), ``run_id``; a user message's content as blank or not (a
    string) or block by block; an assistant message's ``stop_reason``, ``error_message``,
    ``usage`` (for the thread's totals), its tool calls whole (a dangling call is shown and
    settled with its arguments) and, when it makes calls, its ``metadata`` (whether its
    writer journaled them, :data:`core.recovery.JOURNALED_KEY`); a tool result's
    ``tool_call_id``. Each text block becomes an empty or a one-character text (blank or
    not, :func:`core.request.blank`), an image one with or without data to send
    (:func:`core.request.image_source`), thinking and blocks of unknown types an empty one
    of their kind. Dropped: text, images, timestamps, ids, details. Built without
    validation, from an empty message of its class; the blocks are shared between
    skeletons and must not be changed. A skeleton's skeleton is itself. Never raises.
    """
    if isinstance(message, AssistantMessage):
        return _assistant([_block(b) for b in message.content], message)
    if isinstance(message, ToolResultMessage):
        content = [_block(b) for b in message.content]
        return _made(_RESULT, tool_call_id=message.tool_call_id, content=content, run_id=message.run_id)
    if isinstance(message, UserMessage):
        content = message.content
        reduced = _user_content(content if isinstance(content, str) else [_block(b) for b in content])
        return _made(_USER, content=reduced, run_id=message.run_id)
    return _made(_UNKNOWN_ROLE, role=message.role, run_id=message.run_id)


# --- reading skeletons from rows ------------------------------------------------------------


def _instance(cls: type[_B], fields: tuple[dict[str, Any], dict[str, Any] | None, set[str]]) -> _B:
    """The model ``cls`` holding validated ``fields`` (a model-fields schema's output), as
    pydantic's own model schema builds it: the same field values, extra and fields set."""
    made = cls.__new__(cls)
    _set(made, "__dict__", fields[0])
    _set(made, "__pydantic_extra__", fields[1])
    _set(made, "__pydantic_fields_set__", fields[2])
    _set(made, "__pydantic_private__", None)
    return made


def _image(fields: Any) -> ContentBlock:
    return _NO_IMAGE if image_source(_instance(ImageContent, fields)) is None else _IMAGE


_REDUCE: dict[type, Callable[[Any], Any]] = {
    TextContent: lambda f: _BLANK if blank(f[0]["text"]) else _TEXT,
    ThinkingContent: lambda f: _THINKING,
    ImageContent: _image,
    ToolCall: lambda f: _instance(ToolCall, f),
    # A known type is left whole, so the union's own check (a known tag never reads as
    # unknown) still refuses it, as the decoder does.
    UnknownContent: lambda f: _instance(UnknownContent, f) if f[0]["type"] in KNOWN_BLOCK_TYPES else _UNKNOWN,
    Usage: lambda f: _instance(Usage, f),
    UserMessage: lambda f: _made(_USER, content=_user_content(f[0]["content"]), run_id=f[0]["run_id"]),
    AssistantMessage: lambda f: _assistant(f[0]["content"], f[0]),
    ToolResultMessage: lambda f: _made(
        _RESULT, tool_call_id=f[0]["tool_call_id"], content=f[0]["content"], run_id=f[0]["run_id"]
    ),
    UnknownMessage: lambda f: _made(_UNKNOWN_ROLE, role=f[0]["role"], run_id=f[0]["run_id"]),
}
"""How each model of a message becomes its part of the skeleton, from its validated fields
(what :func:`skeleton` keeps of it)."""


def _reducing(schema: Any) -> Any:
    """``schema`` (a pydantic core schema) with each model's construction replaced by its
    reduction (:data:`_REDUCE`): the same validation of the same fields, then the reduction
    of their values instead of a model instance."""
    if isinstance(schema, list):
        return [_reducing(s) for s in schema]
    if isinstance(schema, tuple):  # a union's (choice, tag) pairs
        return tuple(_reducing(s) for s in schema)
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") != "model":
        return {k: _reducing(v) for k, v in schema.items()}
    inner = _reducing(schema["schema"])
    fields = inner
    while fields.get("type", "").startswith("function-"):  # a model validator (ImageContent's)
        fields = fields["schema"]
    assert fields.get("type") == "model-fields", "a message model validates its fields"
    extra = (schema.get("config") or {}).get("extra_fields_behavior")
    if extra is not None:
        fields["extra_behavior"] = extra  # was the model's to apply
    reduced: dict[str, Any] = {
        "type": "function-after",
        "function": {"type": "no-info", "function": _REDUCE[schema["cls"]]},
        "schema": inner,
    }
    if "ref" in schema:
        reduced["ref"] = schema["ref"]
    return reduced


class SkeletonReader:
    """Reads stored rows into skeletons (:func:`skeleton`) without building their messages;
    the :class:`~core.checkpoint.pages.RowReader` of a thread's outline. See the module
    docstring. Thread-safe (the validator is); building one costs ~10 ms (make one, keep it)."""

    def __init__(self) -> None:
        schema = copy.deepcopy(TypeAdapter(Message).core_schema)
        self._validator = SchemaValidator(_reducing(schema))

    def read_json(self, raw: str | bytes) -> AnyMessage:
        """The skeleton of the message stored as JSON ``raw``. Raises ``ValueError`` (a
        ``ValidationError``) for a row it cannot read: the store's decoder then decides."""
        return self._validator.validate_json(raw)  # type: ignore[no-any-return]

    def read_value(self, value: Any) -> AnyMessage:
        """The skeleton of the message stored as ``value`` (a parsed wire value, e.g. a dict
        unpacked from msgpack). Raises ``ValueError`` as :meth:`read_json` does."""
        return self._validator.validate_python(value)  # type: ignore[no-any-return]

    def read_message(self, message: AnyMessage) -> AnyMessage:
        """The skeleton of a decoded ``message`` (:func:`skeleton`)."""
        return skeleton(message)
