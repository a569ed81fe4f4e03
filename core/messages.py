"""Messages and content blocks: the conversation record, in CubePi's JSON shape.

This module is the leaf of ``core``: it imports nothing else from the package, so
storage, providers and the UI can all depend on it.

Wire format (shared with CubePi / ``cubeloop``, see ``DESIGN.md``): every message is
a JSON object with a ``role`` of ``"user"``, ``"assistant"`` or ``"tool_result"``;
content blocks carry a ``type`` of ``"text"``, ``"thinking"``, ``"image"`` or
``"tool_call"``. Fields this project does not model (cubeloop writes ``id``,
``error_type``, ``tokens_in`` and more) are kept through ``extra="allow"`` so a load
followed by a save never drops them. A message whose role we do not know becomes an
:class:`UnknownMessage` rather than an error.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

StopReason = Literal["stop", "tool_use", "length", "aborted", "error"]
"""Why an assistant message ended: the model finished (``stop``), asked for tools
(``tool_use``), hit its output limit (``length``), the user aborted (``aborted``)
or the provider failed (``error``, with ``error_message``)."""


def now() -> float:
    """Current wall-clock time in unix seconds, the unit of every ``timestamp``."""
    return time.time()


class _Wire(BaseModel):
    """Base of every wire object: unknown fields are kept, assignment is not re-validated."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TextContent(_Wire):
    """A block of plain text."""

    type: Literal["text"] = "text"
    text: str = ""


class ThinkingContent(_Wire):
    """The model's reasoning text; ``signature`` is the provider's opaque replay token."""

    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str | None = None


class ImageContent(_Wire):
    """An image, base64-encoded in ``data`` with its ``mime_type`` (e.g. ``image/png``).

    cubeloop names the same two values ``source`` and ``media_type``
    (``cubeloop.providers.base.ImageContent``). Either shape is read (``data`` /
    ``mime_type`` win when both are present and non-empty); cubeloop's is written, since
    both programs read it and the bytes (often megabytes) are then stored once. A
    ``source`` that is not a string (another API's object) is not understood: it is kept
    as it was, and ``data`` is written beside it.
    """

    type: Literal["image"] = "image"
    data: str = ""
    mime_type: str = ""

    @model_validator(mode="before")
    @classmethod
    def _read_either_shape(cls, value: Any) -> Any:
        if not isinstance(value, dict) or ("source" not in value and "media_type" not in value):
            return value
        value = dict(value)
        for ours, theirs in (("data", "source"), ("mime_type", "media_type")):
            if isinstance(value.get(theirs), str):
                given = value.pop(theirs)
                if not value.get(ours):
                    value[ours] = given
        return value

    @model_serializer(mode="wrap")
    def _write_cubeloops_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for ours, theirs in (("data", "source"), ("mime_type", "media_type")):
            if theirs not in out:
                out[theirs] = out.pop(ours)
        return out


class ToolCall(_Wire):
    """A request from the model to run tool ``name`` with JSON ``arguments``.

    ``id`` pairs the call with its :class:`ToolResultMessage` (``tool_call_id``).

    ``arguments_error`` is ``None`` for a call whose arguments were read; otherwise it says
    why the arguments the model sent could not be read, as a clause such as ``"the reply
    was cut off at the output limit"`` or ``"they were not valid JSON: ..."`` (``arguments``
    is then ``{}``, which the model never gave). Such a call is never run: the tool runner
    answers it with an error result (:func:`core.tool_execution.unreadable_arguments_text`),
    so the model can make the call again, and a stored thread keeps the mark, so a resume
    does not run it either. It is written only when set: the row of every readable call is
    exactly what cubeloop writes (cubeloop does not know the field and ignores it).
    """

    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    arguments_error: str | None = None

    @model_serializer(mode="wrap")
    def _omit_readable_mark(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("arguments_error") is None:
            out.pop("arguments_error", None)
        return out


class UnknownContent(_Wire):
    """A content block of a type this version does not know; kept and shown, never dropped."""

    type: str


KNOWN_BLOCK_TYPES = ("text", "thinking", "image", "tool_call")
"""The block ``type`` values this version models; a block of any other type is kept as an :class:`UnknownContent`."""

# How ContentBlock and Message choose their member. Each is a union of two members tried in
# order: "known", a union discriminated by the tag field (``type``, ``role``), which
# pydantic-core reads itself, and "unknown", which takes what the first could not route (a tag
# that is not known, no tag, not an object), and refuses a known tag: a known tag whose object
# is invalid is an error, never an unknown block. Not a Python discriminator: to call one,
# pydantic-core first copies every JSON object it routes into Python objects (measured: a
# third of the cost of decoding a typical stored row). See reported_errors for the errors.
_KNOWN = "known"
_UNKNOWN = "unknown"
_KNOWN_TAG = "known_tag"  # the error type of the "unknown" member refusing a known tag


def _unknown_block(block: UnknownContent) -> UnknownContent:
    if block.type in KNOWN_BLOCK_TYPES:
        raise PydanticCustomError(_KNOWN_TAG, "a block of a known type that is invalid")
    return block


ContentBlock = Annotated[
    Annotated[
        Annotated[TextContent, Tag("text")]
        | Annotated[ThinkingContent, Tag("thinking")]
        | Annotated[ImageContent, Tag("image")]
        | Annotated[ToolCall, Tag("tool_call")],
        Discriminator("type"),
        Tag(_KNOWN),
    ]
    | Annotated[UnknownContent, AfterValidator(_unknown_block), Tag(_UNKNOWN)],
    Field(union_mode="left_to_right"),
]
"""Any content block, chosen by its ``type``; unknown types become :class:`UnknownContent`."""


class Usage(_Wire):
    """Token counts of one model call (tokens, as the provider reports them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


def new_message_id() -> str:
    """A new message ``id`` as cubeloop makes one: ``uuid.uuid4().hex`` (32 hex digits),
    given once, when the message is first saved (``cubeloop.agent.agent._ensure_message_id``)."""
    return uuid.uuid4().hex


class _MessageBase(_Wire):
    timestamp: float | None = Field(default_factory=now)
    """Unix seconds when the message was created (may be out of order in old stores);
    ``None`` when its writer stored none (cubeloop's field is optional: a steer a host
    builds without one is saved as ``"timestamp": null``)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = None
    """The run that produced the message (see ``runs`` in the checkpointer)."""
    id: str = ""
    """The message's transcript identity, cubeloop's: :func:`new_message_id`, given when the
    message is first saved. ``""`` until then, and in rows saved before ids existed (such
    rows keep ``""`` when loaded, so loading stays idempotent, as in cubeloop)."""


class UserMessage(_MessageBase):
    """A message from the user: a prompt, a steer or a follow-up.

    ``content`` may be a plain string (older CubePi rows) or a list of blocks.
    ``metadata["kind"]`` is ``"prompt"``, ``"steer"`` or ``"follow_up"`` when
    written by this project.
    """

    role: Literal["user"] = "user"
    content: str | list[ContentBlock] = Field(default_factory=list)

    @property
    def text(self) -> str:
        """All text blocks joined with newlines."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))


class AssistantMessage(_MessageBase):
    """A reply from the model: text, thinking and tool calls, with why it stopped."""

    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock] = Field(default_factory=list)
    stop_reason: StopReason | str = "stop"
    error_message: str | None = None
    usage: Usage | None = None
    provider_id: str = ""
    model_id: str = ""
    response_id: str | None = None

    @property
    def text(self) -> str:
        """All text blocks joined together (thinking and tool calls excluded)."""
        return "".join(b.text for b in self.content if isinstance(b, TextContent))

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls of this message, in the order the model made them."""
        return [b for b in self.content if isinstance(b, ToolCall)]


class ToolResultMessage(_MessageBase):
    """The outcome of one tool call; ``is_error`` marks failures, ``details`` is tool-specific JSON."""

    role: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    tool_name: str = ""
    content: list[ContentBlock] = Field(default_factory=list)
    details: Any = None
    is_error: bool = False

    @property
    def text(self) -> str:
        """All text blocks joined with newlines."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))


class UnknownMessage(_Wire):
    """A stored message whose ``role`` this version does not know: kept, shown raw, never sent."""

    role: str
    timestamp: float | None = None
    run_id: str | None = None


KNOWN_ROLES = ("user", "assistant", "tool_result")
"""The roles this version models; a message of any other role is kept as an :class:`UnknownMessage`."""


def _unknown_message(message: UnknownMessage) -> UnknownMessage:
    if message.role in KNOWN_ROLES:
        raise PydanticCustomError(_KNOWN_TAG, "a message of a known role that is invalid")
    return message


Message = Annotated[
    Annotated[
        Annotated[UserMessage, Tag("user")]
        | Annotated[AssistantMessage, Tag("assistant")]
        | Annotated[ToolResultMessage, Tag("tool_result")],
        Discriminator("role"),
        Tag(_KNOWN),
    ]
    | Annotated[UnknownMessage, AfterValidator(_unknown_message), Tag(_UNKNOWN)],
    Field(union_mode="left_to_right"),
]
"""Any message, chosen by its ``role``."""

AnyMessage = UserMessage | AssistantMessage | ToolResultMessage | UnknownMessage
"""The plain union of message classes, for type hints."""


def reported_errors(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """The errors of a failed :data:`Message` or :data:`ContentBlock` validation
    (``ValidationError.errors()``) without those that only record how each value was
    routed: a "known" member that found no known tag (the error's location ends at that
    member), and an "unknown" member refusing a known tag (error type ``known_tag``).

    What is left is, in order, what a union choosing by a Python function of the tag
    reports: the errors of the member of the value's tag. Returns ``errors`` itself when
    nothing is left (never, for those unions).
    """
    kept = [e for e in errors if e["type"] != _KNOWN_TAG and not (e["loc"] and e["loc"][-1] == _KNOWN)]
    return kept or errors


class ToolSpec(BaseModel):
    """What a provider is told about a tool: its name, description and JSON Schema of arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


def ensure_message_id(message: AnyMessage) -> AnyMessage:
    """Give ``message`` a :func:`new_message_id`, in place, unless it has an ``id``; returns
    it. Called once, just before a message is first saved, as cubeloop does (so the object
    kept in memory and the row carry the same id). An :class:`UnknownMessage` is left as is."""
    if isinstance(message, (UserMessage, AssistantMessage, ToolResultMessage)) and not message.id:
        message.id = new_message_id()
    return message


def user_text(text: str, *, kind: str = "prompt", run_id: str | None = None) -> UserMessage:
    """Build a user message holding one text block; ``kind`` is prompt, steer or follow_up."""
    return UserMessage(content=[TextContent(text=text)], metadata={"kind": kind}, run_id=run_id)


def error_tool_result(call: ToolCall, text: str, *, run_id: str | None = None, **metadata: Any) -> ToolResultMessage:
    """Build an error tool result for ``call`` with explanatory ``text``."""
    return ToolResultMessage(
        tool_call_id=call.id,
        tool_name=call.name,
        content=[TextContent(text=text)],
        is_error=True,
        run_id=run_id,
        metadata=dict(metadata),
    )
