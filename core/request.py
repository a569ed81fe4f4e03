"""What a provider is sent: the one request builder, and the rule it keeps.

Pure, no I/O. Any stored history (``Sequence[AnyMessage]``, append order) becomes a
request that keeps the rule :func:`check_request` checks, the rule of Anthropic's
Messages API ("Handle tool calls",
https://platform.claude.com/docs/en/agents-and-tools/tool-use/handle-tool-calls: every
``tool_use`` is answered by its ``tool_result`` in the very next message, before any
other content; a request that breaks it is answered 400) and of cubeloop's tool-cycle
check (``cubeloop/agent/_tool_cycle.py``):

* every tool call of an assistant message is followed by exactly one result per call,
  before any other message;
* no tool result without its call (in the window right after it);
* no user text between a call and its result;
* no row of unknown role;
* it starts with a user message and ends with a user message or a tool result (the
  model is asked to answer it: a request ending with an assistant message is a
  "prefill", which the API refuses with extended thinking on, or when it ends in
  whitespace, and which otherwise makes the model continue an old reply);
* no empty or whitespace-only text (the API answers 400 "text content blocks must
  contain non-whitespace text"), no message without content, and no image without data.

The builder places and leaves out, in what is *sent* only; stored rows are never
rewritten. What it did is returned as :class:`Repair` records, which the thread view
words with :func:`repair_words`:

* a user message stored between a call and its result is placed after the results;
* a result stored after a later assistant message (a resumed thread settled late, or
  another writer's messages in between) is placed right after its call;
* a second result for one call is left out (the first is kept), as is a result whose
  call no earlier assistant message made (an orphan), a row of unknown role, and an
  assistant message that ended in a provider error (so a retry never sends a broken
  partial reply); a call repeated under an id already used is left out;
* a call answered nowhere is left out of what is sent (the loop settles every such call
  first, see :meth:`RequestBuilder.unanswered`, so in a run this never happens);
* empty and whitespace-only text blocks are left out silently (they hold nothing), as is
  an assistant message left with no content; a user message left with nothing to send
  (no text, no image: e.g. only a block of a type this version does not know) is left
  out and said, and so is an image without data (:func:`image_source`);
* an assistant message stored before the first user message that is sent (a history
  whose first user message was left out, or a hand-made one) is left out and said, with
  its calls (their results are then orphans). The API requires the first message to be
  a user message; inventing a user message instead would send words nobody wrote, and
  merging the reply into a later turn would change who said it, so leaving it out is
  the one repair that sends only stored words in their stored roles.

Whether the model may be called is :attr:`BuiltRequest.needs_reply`: the request, once
every unanswered call is settled, ends with a user message or a tool result. The loop
never calls the model otherwise (the last reply is final: the run waits for the user).

:class:`RequestBuilder` is incremental: fed the same growing list again, it reads only
the messages appended since, so a model call costs the same at any history length.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from core.messages import (
    AnyMessage,
    AssistantMessage,
    ContentBlock,
    ImageContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UnknownMessage,
    UserMessage,
)

RepairKind = Literal[
    "user_placed",
    "result_placed",
    "duplicate_result",
    "orphan_result",
    "unknown_row",
    "failed_reply",
    "duplicate_call",
    "unanswered_call",
    "empty_user",
    "image_left_out",
    "leading_reply",
]
"""What the builder did with one stored message (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class Repair:
    """One thing done in what is sent: ``kind`` to the message at ``index`` (its position
    in the stored history, 0-based); ``tool_call_id`` names the call concerned, if any."""

    kind: RepairKind
    index: int
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A tool call that has no result anywhere after it: the ``call``, the assistant
    ``message`` that made it (its ``run_id`` is the run that issued the call) and that
    message's ``index`` in the stored history."""

    call: ToolCall
    message: AssistantMessage
    index: int


@dataclass(frozen=True, slots=True)
class BuiltRequest:
    """The messages to send (they pass :func:`check_request`) and what was done to get them.

    ``interleaved`` lists the stored indices of assistant messages whose calls were
    answered only after messages of another run (another writer) were stored in
    between; ``unanswered`` the calls answered nowhere (left out of ``messages``).
    ``needs_reply``: once every unanswered call is settled (its result placed right
    after its call), the request ends with a user message or a tool result, so the model
    may be called; false when it ends with an assistant message (the last reply is
    final) or is empty. Without unanswered calls, ``messages`` passes
    :func:`check_request` exactly when ``needs_reply`` is true.
    """

    messages: Sequence[AnyMessage]
    repairs: tuple[Repair, ...] = ()
    interleaved: tuple[int, ...] = ()
    unanswered: tuple[Unanswered, ...] = ()
    needs_reply: bool = False


_WORDS: dict[RepairKind, tuple[str, str]] = {
    "user_placed": ("user message placed after the tool results", "user messages placed after the tool results"),
    "result_placed": ("result placed after its call", "results placed after their calls"),
    "duplicate_result": (
        "duplicate tool result left out of what is sent",
        "duplicate tool results left out of what is sent",
    ),
    "orphan_result": ("orphan tool result left out of what is sent", "orphan tool results left out of what is sent"),
    "unknown_row": ("row of unknown role left out of what is sent", "rows of unknown role left out of what is sent"),
    "failed_reply": ("failed reply left out of what is sent", "failed replies left out of what is sent"),
    "duplicate_call": (
        "repeated tool call id left out of what is sent",
        "repeated tool call ids left out of what is sent",
    ),
    "unanswered_call": (
        "unanswered tool call left out of what is sent",
        "unanswered tool calls left out of what is sent",
    ),
    "empty_user": (
        "user message with nothing to send left out of what is sent",
        "user messages with nothing to send left out of what is sent",
    ),
    "image_left_out": ("image without data left out of what is sent", "images without data left out of what is sent"),
    "leading_reply": (
        "reply before the first user message left out of what is sent",
        "replies before the first user message left out of what is sent",
    ),
}


def repair_words(repairs: Sequence[Repair]) -> list[str]:
    """One phrase per kind of repair, counted, in a fixed order: e.g.
    ``["1 orphan tool result left out of what is sent", "2 results placed after their calls"]``."""
    counts: dict[RepairKind, int] = {}
    for repair in repairs:
        counts[repair.kind] = counts.get(repair.kind, 0) + 1
    return [f"{n} {_WORDS[kind][0 if n == 1 else 1]}" for kind in _WORDS if (n := counts.get(kind, 0))]


# --- the rule --------------------------------------------------------------------------------


class RequestChecker:
    """Checks the request rule (module docstring) incrementally.

    :meth:`check` on the same list object again reads only what was appended since; any
    other sequence is checked from its start. This is the one implementation of the rule:
    :func:`check_request` and the scripted provider both use it.
    """

    __slots__ = ("_expect", "_ids", "_problem", "_seen", "_source")

    def __init__(self) -> None:
        self._source: Sequence[AnyMessage] | None = None
        self._seen = 0
        self._expect: dict[str, int] = {}  # call id -> index of its assistant message, still to be answered
        self._problem: str | None = None
        self._ids: set[str] = set()

    def check(self, messages: Sequence[AnyMessage]) -> str | None:
        """The first way ``messages`` breaks the rule, as one sentence, or ``None``."""
        if messages is not self._source or len(messages) < self._seen:
            self.__init__()  # type: ignore[misc]
            self._source = messages
        for i in range(self._seen, len(messages)):
            if self._problem is None:
                self._problem = self._step(i, messages[i])
        self._seen = len(messages)
        if self._problem is not None:
            return self._problem
        if self._expect:
            ids = ", ".join(self._expect)
            return f"Tool call(s) {ids} have no result at the end of the request."
        if not messages:
            return "The request has no messages."
        if isinstance(messages[-1], AssistantMessage):
            return (
                f"The request ends with an assistant message (message {len(messages) - 1}, a prefill); "
                "it must end with a user message or a tool result."
            )
        return None

    def _step(self, i: int, message: AnyMessage) -> str | None:
        expect = self._expect
        if isinstance(message, ToolResultMessage):
            if message.tool_call_id not in expect:
                return (
                    f"Message {i} is a tool result for {message.tool_call_id}, which is not a call awaiting its result."
                )
            del expect[message.tool_call_id]
            return _content_problem(i, message.content)
        if expect:
            ids = ", ".join(expect)
            return f"Message {i} ({message.role}) comes before the results of tool call(s) {ids}."
        if isinstance(message, UnknownMessage):
            return f"Message {i} has the unknown role {message.role!r}."
        if i == 0 and not isinstance(message, UserMessage):
            return f"The request starts with an {message.role} message; the first message must be a user message."
        if isinstance(message, UserMessage):
            content = message.content
            if isinstance(content, str):
                return f"Message {i} (user) is empty or only whitespace." if blank(content) else None
            if not any(_carries(b) for b in content):
                return f"Message {i} (user) has no text or image to send."
            return _content_problem(i, content)
        if isinstance(message, AssistantMessage):
            if not message.content:
                return f"Message {i} (assistant) has no content."
            for call in message.tool_calls:
                if call.id in self._ids:
                    return f"Message {i} repeats the tool call id {call.id}."
                self._ids.add(call.id)
                expect[call.id] = i
            return _content_problem(i, message.content)
        return None


def _content_problem(i: int, content: Sequence[ContentBlock]) -> str | None:
    for block in content:
        if isinstance(block, TextContent) and blank(block.text):
            return f"Message {i} has an empty or whitespace-only text block."
        if isinstance(block, ImageContent) and image_source(block) is None:
            return f"Message {i} has an image without data."
    return None


def _carries(block: ContentBlock) -> bool:
    # What makes a user message worth sending: text or an image (a provider sends no
    # block of a type this version does not know).
    if isinstance(block, TextContent):
        return not blank(block.text)
    return isinstance(block, ImageContent) and image_source(block) is not None


def check_request(messages: Sequence[AnyMessage]) -> str | None:
    """The first way ``messages`` breaks the request rule, as one sentence, or ``None``
    when it may be sent. Cost grows with ``len(messages)``; never raises."""
    return RequestChecker().check(messages)


def blank(text: str) -> bool:
    """Whether ``text`` is empty or only whitespace (``str.strip``'s). Such text is never
    sent: the Messages API answers 400 to a text block that is ("text content blocks
    must contain non-whitespace text"), so the builder leaves those blocks out and a
    prompt, steer or follow-up of it is refused (:func:`core.agent.check_user_text`)."""
    return not text.strip()


def image_source(block: ImageContent) -> dict[str, Any] | None:
    """The image's data as a Messages API ``source`` object, or ``None`` when it has none
    that can be sent (then it is left out of what is sent).

    Ours and cubeloop's shape give ``{"type": "base64", "media_type", "data"}`` (both
    needed); a ``source`` that is already such an object (``{"type": "base64", ...}``
    with its data and media type, or ``{"type": "url", "url": ...}``, kept by
    :class:`~core.messages.ImageContent` as an unknown field) is given as it is, copied.
    Source of the shapes: the API's image content block
    (https://platform.claude.com/docs/en/build-with-claude/vision).
    """
    if block.data:
        return {"type": "base64", "media_type": block.mime_type, "data": block.data} if block.mime_type else None
    source = (block.model_extra or {}).get("source")
    if isinstance(source, dict):
        kind = source.get("type")
        if kind == "base64" and source.get("data") and source.get("media_type"):
            return dict(source)
        if kind == "url" and source.get("url"):
            return dict(source)
    return None


# --- the builder -----------------------------------------------------------------------------

_M = TypeVar("_M", UserMessage, AssistantMessage, ToolResultMessage)


class RequestBuilder:
    """Builds the request from a stored history, incrementally (see the module docstring).

    Feed it with :meth:`update` (the same list again, grown, costs only the new
    messages; any other sequence, or a shorter one, starts over), then read
    :meth:`request`, :meth:`built`, :meth:`unanswered` and :meth:`needs_reply`.
    ``tail=True`` reads a history that is the tail of a longer one (a thread summary's
    messages from its last assistant message on): a user message is taken to have been
    sent before it, so its first assistant message is not left out as leading.

    A history read in pieces (a store handing its rows over a chunk at a time) is fed with
    :meth:`extend` instead. ``keep_request=False`` keeps of the finished part of the request
    only its last message: enough for :meth:`needs_reply`, the repairs and the unanswered
    calls (all a diagnosis reads, :mod:`core.recovery`), so the builder's memory grows with
    the open part, not with the history; :meth:`request` and ``BuiltRequest.messages`` are
    then not what would be sent, and must not be.

    Internals: ``_out`` holds the finished part of the request and only ever grows in
    place (so the list a provider was given stays valid and its readers can go on
    incrementally); ``_region`` holds the stored messages from the first assistant
    message whose calls are not all answered on, until they all are.
    """

    __slots__ = (
        "_answered",
        "_foreign",
        "_interleaved",
        "_issued",
        "_keep",
        "_open",
        "_out",
        "_region",
        "_repairs",
        "_results",
        "_seen",
        "_source",
        "_started",
        "_tail",
        "_waiting",
        "_watch",
    )

    def __init__(self, *, tail: bool = False, keep_request: bool = True) -> None:
        self._tail = tail
        self._keep = keep_request
        self._started = tail  # a user message is in the request (else replies are leading)
        self._source: Sequence[AnyMessage] | None = None
        self._seen = 0
        self._out: list[AnyMessage] = []
        self._repairs: list[Repair] = []
        self._interleaved: list[int] = []
        self._issued: set[str] = set()
        self._answered: set[str] = set()
        self._open: dict[str, Unanswered] = {}
        self._region: list[tuple[int, AnyMessage]] = []  # stored (index, user or assistant message)
        self._results: dict[str, tuple[int, ToolResultMessage]] = {}  # answers to the region's calls
        self._foreign: set[int] = set()  # region assistants answered after another run's messages
        self._watch: dict[str, dict[int, None]] = {}  # run id -> its assistants with calls open, not yet foreign
        self._waiting: dict[int, int] = {}  # assistant index -> how many of its calls are open

    def update(self, history: Sequence[AnyMessage], upto: int | None = None) -> None:
        """Read the messages of ``history`` not read yet (all of it if it is a new sequence),
        up to index ``upto`` (exclusive; ``None``: to its end), so a long history can be
        read in slices with the event loop let in between."""
        if history is not self._source or len(history) < self._seen:
            self.__init__(tail=self._tail, keep_request=self._keep)  # type: ignore[misc]
            self._source = history
        end = len(history) if upto is None else min(upto, len(history))
        for i in range(self._seen, end):
            self._add(i, history[i])
        self._seen = max(self._seen, end)

    def extend(self, messages: Iterable[AnyMessage]) -> None:
        """Read ``messages`` as the next messages of the history read so far (their indices
        go on from there): a history read in pieces. Do not mix with :meth:`update`, which
        starts over on any sequence other than the one it was last given."""
        self._source = None
        i = self._seen
        for message in messages:
            self._add(i, message)
            i += 1
        self._seen = i

    def request(self) -> Sequence[AnyMessage]:
        """The messages to send. With every call answered this is the builder's own list,
        grown in place since the last call; otherwise a new list with the unanswered calls
        left out. Treat it as read-only."""
        if not self._region:
            return self._out
        return self._out + self._emit(final=False)[0]

    def built(self) -> BuiltRequest:
        """The request with every repair and finding (a new object; cost grows with the
        open part and the number of repairs, not with the history)."""
        if not self._region:
            return BuiltRequest(self._out, tuple(self._repairs), tuple(self._interleaved), (), self.needs_reply())
        tail, repairs, interleaved = self._emit(final=False)
        return BuiltRequest(
            self._out + tail,
            tuple(self._repairs) + repairs,
            tuple(self._interleaved) + interleaved,
            tuple(self._open.values()),
            self.needs_reply(),
        )

    def needs_reply(self) -> bool:
        """Whether the request, once every unanswered call is settled, ends with a user
        message or a tool result (see :attr:`BuiltRequest.needs_reply`). Constant cost.

        Settling places each result right after its call, so the end is the open part's
        last stored message: a user message, or an assistant message whose calls the
        results then follow; a reply without calls there is final. A tail with nothing
        to send is taken to end as the thread before it did, with a user-side message
        (the tail starts at the last reply, so only a failed one, left out, leaves it so).
        """
        if self._region:
            last = self._region[-1][1]
            return not isinstance(last, AssistantMessage) or bool(last.tool_calls)
        if not self._out:
            return self._tail
        return not isinstance(self._out[-1], AssistantMessage)

    def unanswered(self) -> list[Unanswered]:
        """Calls with no result anywhere after them, in the order they were made; the
        loop settles these before every model call. Cost grows with their number only."""
        return list(self._open.values())

    # --- reading one stored message ---------------------------------------------------------

    def _add(self, i: int, message: AnyMessage) -> None:
        if self._watch and message.run_id is not None:
            self._note_writer(message)
        if isinstance(message, ToolResultMessage):
            self._add_result(i, self._trimmed(i, message))
        elif isinstance(message, AssistantMessage):
            self._add_assistant(i, message)
        elif isinstance(message, UserMessage):
            self._add_user(i, message)
        else:
            self._repairs.append(Repair("unknown_row", i))

    def _trimmed(self, i: int, message: _M) -> _M:
        # The message without blank text and images without data (a copy only if it had any).
        content = message.content
        if isinstance(content, str):
            return message
        if not any(
            (isinstance(b, TextContent) and blank(b.text)) or (isinstance(b, ImageContent) and image_source(b) is None)
            for b in content
        ):
            return message
        kept = []
        for block in content:
            if isinstance(block, TextContent) and blank(block.text):
                continue
            if isinstance(block, ImageContent) and image_source(block) is None:
                self._repairs.append(Repair("image_left_out", i))
                continue
            kept.append(block)
        return message.model_copy(update={"content": kept})

    def _add_user(self, i: int, message: UserMessage) -> None:
        content = message.content
        if blank(content) if isinstance(content, str) else not any(_carries(b) for b in content):
            self._trimmed(i, message)  # says which images were left out
            self._repairs.append(Repair("empty_user", i))
            return
        self._started = True
        self._add_plain(i, self._trimmed(i, message))

    def _add_plain(self, i: int, message: AnyMessage) -> None:
        # A message that makes no call: sent where it is, or after the open calls' results.
        if self._region:
            self._region.append((i, message))
        else:
            self._out.append(message)
            if not self._keep:
                del self._out[:-1]

    def _note_writer(self, message: AnyMessage) -> None:
        # A message of another run while calls are open marks their assistant message as
        # interleaved, unless the message is one of that assistant's own results.
        own = None
        if isinstance(message, ToolResultMessage) and message.tool_call_id in self._open:
            own = self._open[message.tool_call_id].index
        for run_id in [r for r in self._watch if r != message.run_id]:
            indices = self._watch[run_id]
            for index in [k for k in indices if k != own]:
                del indices[index]
                self._foreign.add(index)
            if not indices:
                del self._watch[run_id]

    def _add_assistant(self, i: int, message: AssistantMessage) -> None:
        if message.stop_reason == "error":
            self._repairs.append(Repair("failed_reply", i))
            return
        message = self._trimmed(i, message)
        if not message.content:
            return  # nothing in it to send (and nothing lost)
        if not self._started:
            self._repairs.append(Repair("leading_reply", i))
            return
        calls = message.tool_calls
        if not calls:
            self._add_plain(i, message)
            return
        ids = {c.id for c in calls}
        if len(ids) < len(calls) or not self._issued.isdisjoint(ids):
            seen: set[str] = set()
            keep = []
            for block in message.content:
                if isinstance(block, ToolCall):
                    if block.id in self._issued or block.id in seen:
                        self._repairs.append(Repair("duplicate_call", i, block.id))
                        continue
                    seen.add(block.id)
                keep.append(block)
            message = message.model_copy(update={"content": keep})
            calls = message.tool_calls
        if not calls:  # every call repeated an id already used
            if message.content:
                self._add_plain(i, message)
            return
        for call in calls:
            self._issued.add(call.id)
            self._open[call.id] = Unanswered(call, message, i)
        self._waiting[i] = len(calls)
        if message.run_id is not None:
            self._watch.setdefault(message.run_id, {})[i] = None
        self._region.append((i, message))

    def _add_result(self, i: int, result: ToolResultMessage) -> None:
        call_id = result.tool_call_id
        if call_id in self._open:
            pending = self._open.pop(call_id)
            self._answered.add(call_id)
            self._results[call_id] = (i, result)
            self._close_call(pending)
            if not self._open:
                tail, repairs, interleaved = self._emit(final=True)
                self._out.extend(tail)
                if not self._keep:
                    del self._out[:-1]
                self._repairs.extend(repairs)
                self._interleaved.extend(interleaved)
                self._region.clear()
                self._results.clear()
                self._foreign.clear()
                self._watch.clear()
                self._waiting.clear()
        elif call_id in self._answered:
            self._repairs.append(Repair("duplicate_result", i, call_id))
        else:
            self._repairs.append(Repair("orphan_result", i, call_id))

    def _close_call(self, pending: Unanswered) -> None:
        left = self._waiting[pending.index] - 1
        if left:
            self._waiting[pending.index] = left
            return
        del self._waiting[pending.index]
        run_id = pending.message.run_id
        watched = self._watch.get(run_id) if run_id is not None else None
        if watched is not None:
            watched.pop(pending.index, None)
            if not watched:
                del self._watch[run_id]  # type: ignore[arg-type]

    # --- writing the open part ----------------------------------------------------------------

    def _emit(self, *, final: bool) -> tuple[list[AnyMessage], tuple[Repair, ...], tuple[int, ...]]:
        """The region as sent: each assistant message, then its results in stored order,
        then the user messages that were stored among them. Not final: calls still open
        are left out (and so is an assistant message left with no content)."""
        results = self._results
        if final and len(self._region) == 1:
            # The common turn: one assistant message, then its results (stored in order).
            index, message = self._region[0]
            return [message, *(r for _, r in results.values())], (), ((index,) if index in self._foreign else ())
        out: list[AnyMessage] = []
        repairs: list[Repair] = []
        interleaved: list[int] = []
        last_answer = -1  # stored index of the last result of an assistant message already written
        assistants = [j for j, m in self._region if isinstance(m, AssistantMessage)]
        for index, message in self._region:
            if isinstance(message, UserMessage):
                if index < last_answer:
                    repairs.append(Repair("user_placed", index))
                out.append(message)
                continue
            assert isinstance(message, AssistantMessage)
            calls = message.tool_calls
            answers = sorted(results[c.id] for c in calls if c.id in results)
            if not final and len(answers) < len(calls):
                for call in calls:
                    if call.id not in results:
                        repairs.append(Repair("unanswered_call", index, call.id))
                kept = [b for b in message.content if not isinstance(b, ToolCall) or b.id in results]
                message = message.model_copy(update={"content": kept})
            if message.content:
                out.append(message)
            after = bisect.bisect_right(assistants, index)
            next_assistant = assistants[after] if after < len(assistants) else None
            for at, result in answers:
                if next_assistant is not None and next_assistant < at:
                    repairs.append(Repair("result_placed", at, result.tool_call_id))
                out.append(result)
                last_answer = max(last_answer, at)
            if answers and index in self._foreign:
                interleaved.append(index)
        return out, tuple(repairs), tuple(interleaved)


def build_request(history: Sequence[AnyMessage], *, tail: bool = False) -> BuiltRequest:
    """The request for ``history`` in one pass (see the module docstring); never raises.
    ``tail``: ``history`` is the tail of a longer thread (see :class:`RequestBuilder`).

    ``BuiltRequest.messages`` passes :func:`check_request` whenever it has no unanswered
    calls and ``needs_reply`` is true (otherwise it may end with a reply, or be empty);
    every call of a sent assistant message that has a result anywhere after it is sent,
    with its first result.
    """
    builder = RequestBuilder(tail=tail)
    builder.update(history)
    return builder.built()


# --- text a provider can carry ---------------------------------------------------------------

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def sendable(value: Any) -> Any:
    """``value`` (JSON-shaped: dicts, lists, strings, numbers) with every lone surrogate in
    its strings replaced by its escape, the six ASCII characters ``\\udcff``.

    A lone surrogate is an undecodable byte kept by ``errors="surrogateescape"`` (a tool's
    output, a file name); UTF-8 cannot encode it, so a request body holding one cannot be
    sent at all (the Anthropic SDK encodes strictly and fails). The escape is the form the
    store keeps it in and the app shows, so the model reads what the user sees. Containers
    holding no such string are returned as they are (the same objects), changed ones are
    copied: ``value`` itself is never modified, since it may hold stored messages' data.
    """
    if isinstance(value, str):
        if value.isascii() or _LONE_SURROGATE.search(value) is None:
            return value
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        changed = {k: sendable(v) for k, v in value.items()}
        return value if all(changed[k] is v for k, v in value.items()) else changed
    if isinstance(value, list):
        items = [sendable(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
