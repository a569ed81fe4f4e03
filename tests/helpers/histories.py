"""Random stored histories for property-based tests (hypothesis): as any writer might
leave them - calls, results, orphans, duplicates, reused call ids, user messages
interleaved, unknown rows, failed replies, messages of several runs."""

from __future__ import annotations

from hypothesis import strategies as st

from core.messages import (
    AnyMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UnknownMessage,
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


@st.composite
def histories(draw: st.DrawFn) -> list[AnyMessage]:
    """A stored history as any writer might leave it."""
    out: list[AnyMessage] = [user_text("start", run_id="r1")]
    issued: list[str] = []
    counter = 0
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(
            st.sampled_from(["user", "assistant", "assistant", "result", "result", "orphan", "unknown", "failed"])
        )
        run = draw(_RUNS)
        if kind == "user":
            out.append(user_text("u", run_id=run))
        elif kind in ("assistant", "failed"):
            ids = []
            for _ in range(draw(st.integers(0, 3))):
                if issued and draw(st.integers(0, 9)) == 0:
                    ids.append(draw(st.sampled_from(issued)))  # a writer reusing a call id
                else:
                    counter += 1
                    ids.append(f"c{counter}")
            issued.extend(ids)
            out.append(assistant(*ids, run=run, stop="error" if kind == "failed" else None, text="t"))
        elif kind == "result" and issued:
            out.append(result(draw(st.sampled_from(issued)), run))
        elif kind == "orphan":
            out.append(result(f"x{draw(st.integers(0, 99))}", run))
        elif kind == "unknown":
            out.append(UnknownMessage(role="system", run_id=run))
    return out
