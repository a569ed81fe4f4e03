"""A thread's history read once, a piece at a time, keeping only what a diagnosis reads.

:func:`core.recovery.diagnose` classifies a whole stored thread. Reading a long thread
whole - every message decoded and held at once - costs memory that grows with its
length (issue 10: 453 MB with a 100,000-message thread open). :class:`HistoryFold` is the
same reading done as a fold: the messages go in, in append order, in pieces of any size
(a store's chunks), and what remains is the request builder's state
(:class:`core.request.RequestBuilder`, keeping only the open part of the request) plus a
few counts and indices. :func:`core.recovery.diagnose` itself is this fold over the list
it is given, so there is one reading of a history, whichever way it arrives.

With ``compact=True`` each message is first cut down to its :func:`skeleton`: the
message's class, run, stop reason and error, its tool calls and result ids, and for
every content block only whether it would be sent (see the function). Whatever the fold
keeps (the open calls and what follows them, the last reply) is then kept small too.
Exactness rests on two facts checked by ``tests/core/test_recovery_fold.py`` on generated
histories (hypothesis) and on the threads the real cubeloop writes: the builder reads
nothing a skeleton drops, and feeding pieces is feeding the whole.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable
from typing import Any, TypeVar

from core.messages import (
    AnyMessage,
    AssistantMessage,
    ContentBlock,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    UserMessage,
)
from core.request import BuiltRequest, RequestBuilder, blank, image_source

# Blocks shared by every skeleton (never changed: the builder copies messages it trims).
_TEXT = TextContent.model_construct(type="text", text="x")
_BLANK = TextContent.model_construct(type="text", text="")
_IMAGE = ImageContent.model_construct(type="image", data="x", mime_type="x")
_NO_IMAGE = ImageContent.model_construct(type="image", data="", mime_type="")
_THINKING = ThinkingContent.model_construct(type="thinking", thinking="", signature=None)
_UNKNOWN = UnknownContent.model_construct(type="unknown")
_NO_METADATA: dict[str, Any] = {}
_M = TypeVar("_M", AssistantMessage, ToolResultMessage, UserMessage, UnknownMessage)


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


def skeleton(message: AnyMessage) -> AnyMessage:
    """What a diagnosis reads of ``message``, as a message of the same class.

    Kept: the class (role), ``run_id``; a user message's content as blank or not (a
    string) or block by block; an assistant message's ``stop_reason``, ``error_message``,
    its tool calls whole (a dangling call is shown and settled with its arguments) and, when
    it makes calls, its ``metadata`` (whether its writer journaled them,
    :data:`core.recovery.JOURNALED_KEY`); a tool result's ``tool_call_id``. Each text block
    becomes an empty or a one-character text (blank or not, :func:`core.request.blank`), an
    image one with or without data to send (:func:`core.request.image_source`), thinking and
    blocks of unknown types an empty one of their kind. Dropped: text, images, usage,
    timestamps, ids, details. Built without validation (the message was validated when
    decoded), from an empty message of its class; the blocks are shared between skeletons and must not be changed. Never raises.
    """
    if isinstance(message, AssistantMessage):
        calls = any(isinstance(b, ToolCall) for b in message.content)
        return _made(
            _ASSISTANT,
            content=[_block(b) for b in message.content],
            stop_reason=message.stop_reason,
            error_message=message.error_message,
            run_id=message.run_id,
            metadata=message.metadata if calls else _NO_METADATA,
        )
    if isinstance(message, ToolResultMessage):
        return _made(
            _RESULT,
            tool_call_id=message.tool_call_id,
            content=[_block(b) for b in message.content],
            run_id=message.run_id,
        )
    if isinstance(message, UserMessage):
        content = message.content
        reduced: str | list[ContentBlock] = (
            ("" if blank(content) else "x") if isinstance(content, str) else [_block(b) for b in content]
        )
        return _made(_USER, content=reduced, run_id=message.run_id)
    return _made(_UNKNOWN_ROLE, role=message.role, run_id=message.run_id)


# One empty message of each class, copied for each skeleton: ``model_construct`` costs
# ~50 us a call here (pydantic 2.14) and ``copy.copy`` ~15 us; setting the four slots
# pydantic's own ``__copy__`` sets, sharing the parts no skeleton changes (the set of fields
# set, the empty extra: ``model_copy``, the builder's only change, copies both), ~2 us.
_ASSISTANT = AssistantMessage.model_construct(timestamp=None)
_RESULT = ToolResultMessage.model_construct(tool_call_id="", timestamp=None)
_USER = UserMessage.model_construct(timestamp=None)
_UNKNOWN_ROLE = UnknownMessage.model_construct(role="unknown")
_set = object.__setattr__


def _made(template: _M, **fields: Any) -> _M:
    made = template.__class__.__new__(template.__class__)
    values = template.__dict__.copy()
    values.update(fields)
    _set(made, "__dict__", values)
    _set(made, "__pydantic_fields_set__", template.__pydantic_fields_set__)
    _set(made, "__pydantic_extra__", template.__pydantic_extra__)
    _set(made, "__pydantic_private__", None)
    return made


class HistoryFold:
    """A thread's stored history read in append order, in pieces; see the module docstring.

    Feed it with :meth:`add` (any number of times); read :meth:`built` and the counts at
    any point (reading changes nothing, feeding may go on). ``tail=True`` reads the tail of
    a longer thread (:class:`core.request.RequestBuilder`'s ``tail``); ``compact=True``
    keeps :func:`skeleton` of each message instead of the message. Indices are positions
    in the history fed (0-based). Memory: the builder's open part and the messages after
    the last assistant message, plus 8 bytes per user message and per assistant message.
    """

    __slots__ = (
        "_after_results",
        "_assistants",
        "_builder",
        "_compact",
        "_last",
        "_user_after",
        "_users",
        "count",
        "last_known",
        "tail",
        "unknown",
    )

    def __init__(self, *, tail: bool = False, compact: bool = False) -> None:
        self._builder = RequestBuilder(tail=tail, keep_request=False)
        self._compact = compact
        self.tail = tail
        """Whether the history is the tail of a longer thread."""
        self.count = 0
        """How many messages were fed."""
        self.unknown = 0
        """How many of them are of a role this version does not know."""
        self.last_known = -1
        """The index of the last message of a known role (-1: none)."""
        self._last: tuple[int, AssistantMessage] | None = None
        self._users = array("q")
        self._assistants = array("q")
        self._after_results: list[int] = []  # tool results stored after the last assistant message
        self._user_after = False

    def add(self, messages: Iterable[AnyMessage]) -> None:
        """Read ``messages``, the next messages of the history (append order)."""
        kept: list[AnyMessage] = []
        i = self.count
        for message in messages:
            if self._compact:
                message = skeleton(message)
            kept.append(message)
            if isinstance(message, UnknownMessage):
                self.unknown += 1
            else:
                self.last_known = i
                if isinstance(message, AssistantMessage):
                    self._assistants.append(i)
                    self._last = (i, message)
                    self._after_results.clear()
                    self._user_after = False
                elif isinstance(message, UserMessage):
                    self._users.append(i)
                    self._user_after = True
                elif isinstance(message, ToolResultMessage):
                    self._after_results.append(i)
            i += 1
        self.count = i
        self._builder.extend(kept)

    def built(self) -> BuiltRequest:
        """The request builder's findings (``messages`` holds at most the open part and one
        message before it: see ``RequestBuilder(keep_request=False)``)."""
        return self._builder.built()

    @property
    def last_assistant(self) -> tuple[int, AssistantMessage] | None:
        """The last assistant message and its index (its skeleton when compact), or ``None``."""
        return self._last

    @property
    def user_after_last_assistant(self) -> bool:
        """Whether a user message was stored after the last assistant message (or, with no
        assistant message, at all)."""
        return self._user_after

    @property
    def results_after_last_assistant(self) -> list[int]:
        """Indices of the tool results stored after the last assistant message (all of them
        when there is none), in order."""
        return list(self._after_results)

    def users_after(self, index: int) -> int:
        """How many user messages were stored after ``index``."""
        return len(self._users) - bisect.bisect_right(self._users, index)

    def replies_after(self, index: int) -> int:
        """How many assistant messages were stored after ``index``."""
        return len(self._assistants) - bisect.bisect_right(self._assistants, index)
