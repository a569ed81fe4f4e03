"""Random stored histories for property-based tests (hypothesis): as any writer might
leave them - calls, results, orphans, duplicates, reused call ids, user messages
interleaved, unknown rows, failed replies, messages of several runs, empty and
whitespace-only text, user messages with nothing to send, images with and without data,
and histories that do not start with a sendable user message."""

from __future__ import annotations

from hypothesis import strategies as st

from core.messages import (
    AnyMessage,
    AssistantMessage,
    ImageContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UnknownContent,
    UnknownMessage,
    UserMessage,
    user_text,
)


def assistant(*ids: str, run: str | None = "r1", stop: str | None = None, text: str = "") -> AssistantMessage:
    """An assistant message making the calls ``ids`` (of a tool named ``tool``), in run ``run``."""
    content: list = [TextContent(text=text)] if text else []
    content += [ToolCall(id=i, name="tool") for i in ids]
    return AssistantMessage(content=content, stop_reason=stop or ("tool_use" if ids else "stop"), run_id=run)


def result(call_id: str, run: str | None = "r1") -> ToolResultMessage:
    """A tool result answering ``call_id``, in run ``run``."""
    return ToolResultMessage(tool_call_id=call_id, tool_name="tool", content=[TextContent(text=call_id)], run_id=run)


_RUNS = st.sampled_from(["r1", "r2", None])

PNG = "iVBORw0KGgo="
"""A few base64 bytes standing for an image."""

_IMAGES = st.sampled_from(
    [
        ImageContent(data=PNG, mime_type="image/png"),
        ImageContent.model_validate({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}),
        ImageContent(),  # no data at all
        ImageContent.model_validate({"type": "image", "source": "", "media_type": "image/png"}),
    ]
)
_TEXT = st.sampled_from(["u", "", "  ", "\n\t"])


@st.composite
def _user(draw: st.DrawFn, run: str | None) -> UserMessage:
    # Text (perhaps empty or only whitespace), a plain string, images, an unknown block.
    shape = draw(st.sampled_from(["text", "text", "string", "mixed"]))
    if shape == "text":
        return user_text(draw(_TEXT), run_id=run)
    if shape == "string":
        return UserMessage(content=draw(_TEXT), run_id=run)
    blocks = draw(
        st.lists(
            st.one_of(_TEXT.map(lambda t: TextContent(text=t)), _IMAGES, st.just(UnknownContent(type="document"))),
            min_size=0,
            max_size=3,
        )
    )
    return UserMessage(content=blocks, run_id=run)


@st.composite
def histories(draw: st.DrawFn) -> list[AnyMessage]:
    """A stored history as any writer might leave it; most start with a user message
    that can be sent, the rest with one that cannot, or with a reply."""
    start = draw(st.sampled_from(["user"] * 6 + ["nothing", "reply"]))
    out: list[AnyMessage] = []
    if start == "user":
        out.append(user_text("start", run_id="r1"))
    elif start == "nothing":
        out.append(UserMessage(content=[UnknownContent(type="document")], run_id="r1"))
    issued: list[str] = []
    counter = 0
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(
            st.sampled_from(["user", "assistant", "assistant", "result", "result", "orphan", "unknown", "failed"])
        )
        run = draw(_RUNS)
        if kind == "user":
            out.append(draw(_user(run)))
        elif kind in ("assistant", "failed"):
            ids = []
            for _ in range(draw(st.integers(0, 3))):
                if issued and draw(st.integers(0, 9)) == 0:
                    ids.append(draw(st.sampled_from(issued)))  # a writer reusing a call id
                else:
                    counter += 1
                    ids.append(f"c{counter}")
            issued.extend(ids)
            text = draw(st.sampled_from(["t", "t", "", " "]))
            reply = assistant(*ids, run=run, stop="error" if kind == "failed" else None, text="x")
            reply.content[0] = TextContent(text=text)  # empty or whitespace-only text, sometimes
            out.append(reply)
        elif kind == "result" and issued:
            answer = result(draw(st.sampled_from(issued)), run)
            if draw(st.integers(0, 3)) == 0:
                answer.content = [TextContent(text=draw(_TEXT)), draw(_IMAGES)]
            out.append(answer)
        elif kind == "orphan":
            out.append(result(f"x{draw(st.integers(0, 99))}", run))
        elif kind == "unknown":
            out.append(UnknownMessage(role="system", run_id=run))
    return out
