"""The demo agent: a scripted model and three slow tools, so everything works without an API key.

It lives in ``core`` so the headless runner (``python -m core.runner run --demo``) and the
app (``tui``) use the one same agent.

The model is a :class:`~core.providers.faux.FauxProvider` whose script is one function
that answers any conversation:

* a new prompt (or a follow-up): a few sentences, then ``fetch_dataset`` and
  ``train_model`` in parallel;
* after those results: a sentence, then ``write_report``;
* after any other results (its own, or a foreign thread's unknown tools, including
  calls recovery recorded as interrupted): a final summary that quotes them;
* a steer that arrived since its last reply is acknowledged by quoting it.

The tools take several seconds each, report progress about every 0.2 s, stop at once
when the run is aborted, and are idempotent (same arguments, same result), so resume
may re-run them. ``train_model`` does its work in a real child process (a small Python
script printing one line per step) through :func:`core.processes.run_process`: an abort
ends the child's whole process group, and its result then says "aborted after start;
partial effects possible". Every call carries ``request``, the number of the prompt or follow-up
it serves: a new request is new work, while a resume re-runs (or reuses) the job of the
same request. ``speed`` scales every delay (tests use a large value).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from core.errors import ToolError
from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, UserMessage
from core.processes import run_process
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_thinking, faux_tool_call
from core.tools import AgentToolResult, ToolContext, tool

SYSTEM_PROMPT = (
    "You are a careful data assistant. Use fetch_dataset and train_model (they may run in "
    "parallel), then write_report, then summarise what you did in a few sentences."
)
"""Given to every agent; the demo ignores it, a real model follows it."""

DELTA_DELAY = 0.03
"""Seconds between streamed deltas at speed 1 (a readable pace)."""

TICK = 0.2
"""Seconds between progress reports of a demo tool at speed 1."""

_FIRST_TOOLS = {"fetch_dataset", "train_model"}


# --- the scripted model ------------------------------------------------------------------


def respond(request: ModelRequest) -> AssistantMessage:
    """The demo model's reply to ``request`` (see the module docstring for the script)."""
    messages = list(request.messages)
    last_reply = _last_index(messages, AssistantMessage)
    tail = messages[last_reply + 1 :] if last_reply is not None else messages
    results = [m for m in tail if isinstance(m, ToolResultMessage)]
    users = [m for m in tail if isinstance(m, UserMessage)]
    steers = [m for m in users if (m.metadata or {}).get("kind") == "steer"]
    ack = "".join(f"Noted your steer: “{_short(m.text)}”. I will take it into account. " for m in steers)

    nth = _request_number(messages)
    if results and last_reply is not None:
        called = {c.name for c in messages[last_reply].tool_calls}  # type: ignore[union-attr]
        if called and called <= _FIRST_TOOLS:
            return faux_reply(
                faux_text(
                    f"{ack}The dataset is loaded and the model is trained. "
                    "Next I will write a short report of the results."
                ),
                faux_tool_call("write_report", {"title": _topic(messages), "sections": 3, "request": nth}),
            )
        return faux_reply(faux_text(ack + _summary(results)))

    latest = users[-1] if users else _last_user(messages)
    kind = (latest.metadata or {}).get("kind", "prompt") if latest is not None else "prompt"
    asked = _short(latest.text) if latest is not None else "the task"
    if kind == "follow_up":
        return faux_reply(
            faux_text(
                f"{ack}Following up on “{asked}”. I will update the report with that in mind; this takes a few seconds."
            ),
            faux_tool_call("write_report", {"title": asked, "sections": 2, "request": nth}),
        )
    return faux_reply(
        faux_thinking(
            "The user wants a result they can check. Fetching and training are independent, "
            "so both can run at once; the report needs both."
        ),
        faux_text(
            f"{ack}You asked: “{asked}”. I will work on it in three steps. First I fetch the data "
            "and, at the same time, train a baseline model, so neither waits for the other. "
            "Both take a few seconds and report their progress as they go. "
            "When they finish I will write a short report and summarise it here."
        ),
        faux_tool_call("fetch_dataset", {"name": "demo-sales", "rows": 50_000, "request": nth}),
        faux_tool_call("train_model", {"model": "baseline", "epochs": 5, "request": nth}),
    )


def _summary(results: Sequence[ToolResultMessage]) -> str:
    lines = ["Here is what happened:"]
    for result in results:
        outcome = "failed" if result.is_error else "returned"
        lines.append(f"\n- **{result.tool_name or 'a tool'}** {outcome}: {_short(result.text, 160)}")
    failed = any(r.is_error for r in results)
    lines.append(
        "\n\nSome steps did not finish; their effects should be checked before relying on them."
        if failed
        else "\n\nEverything finished. Ask a follow-up if you want more detail."
    )
    return "".join(lines)


def _request_number(messages: Sequence[AnyMessage]) -> int:
    """How many prompts and follow-ups the conversation holds (steers refine a request)."""
    return sum(
        1 for m in messages if isinstance(m, UserMessage) and (m.metadata or {}).get("kind", "prompt") != "steer"
    )


def _topic(messages: Sequence[AnyMessage]) -> str:
    first = next((m for m in messages if isinstance(m, UserMessage)), None)
    return _short(first.text, 60) if first is not None else "report"


def _last_user(messages: Sequence[AnyMessage]) -> UserMessage | None:
    index = _last_index(messages, UserMessage)
    return messages[index] if index is not None else None  # type: ignore[return-value]


def _last_index(messages: Sequence[AnyMessage], kind: type) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], kind):
            return i
    return None


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def demo_provider(speed: float = 1.0) -> FauxProvider:
    """The demo model: answers any conversation, streaming at ``DELTA_DELAY / speed``."""
    return FauxProvider(fallback=respond, model="demo", delay=DELTA_DELAY / speed, record=False)


# --- the slow tools ------------------------------------------------------------------------


async def _work(ctx: ToolContext, seconds: float, steps: Sequence[str], speed: float) -> None:
    """Spend ``seconds / speed`` in ticks, reporting progress; stop at once on abort."""
    tick = TICK / speed
    ticks = max(1, round(seconds / TICK))
    for i in range(ticks):
        try:
            await asyncio.wait_for(ctx.signal.wait(), timeout=tick)
        except TimeoutError:
            pass
        if ctx.signal.is_set():
            raise ToolError("Stopped: the run was aborted.")
        step = steps[min(i * len(steps) // ticks, len(steps) - 1)]
        ctx.report(progress=(i + 1) / ticks, text=step)


# The child process of ``train_model``: prints each step (argv[2:]) after sleeping a tick (argv[1] s).
_TRAINER = (
    "import sys, time\nfor step in sys.argv[2:]:\n    time.sleep(float(sys.argv[1]))\n    print(step, flush=True)\n"
)


async def _work_in_child(
    ctx: ToolContext, seconds: float, steps: Sequence[str], speed: float
) -> AgentToolResult | None:
    """Like :func:`_work`, done by a child process that prints one line per tick; returns
    the error result when the child did not finish (aborted, or it failed), else ``None``."""
    ticks = max(1, round(seconds / TICK))
    lines = [steps[min(i * len(steps) // ticks, len(steps) - 1)] for i in range(ticks)]
    done = 0

    def on_line(line: str) -> None:
        nonlocal done
        done += 1
        ctx.report(progress=done / ticks, text=line)

    argv = [sys.executable, "-c", _TRAINER, str(TICK / speed), *lines]
    outcome = await run_process(ctx, argv, on_line=on_line, label="the trainer process")
    result = outcome.tool_result()
    if not result.is_error:
        return None
    # Its output is one line per step so far: the first line says all a reader needs.
    return AgentToolResult(str(result.content).split("\n")[0], details=result.details, is_error=True)


def demo_tools(speed: float = 1.0) -> list[Any]:
    """``fetch_dataset``, ``train_model`` and ``write_report``, paced by ``speed``."""

    @tool(idempotent=True)
    async def fetch_dataset(name: str, rows: int, ctx: ToolContext, request: int = 1) -> str:
        """Download a dataset by name and return a short description (takes about 4 s)."""
        shards = 8
        await _work(ctx, 4.0, [f"downloading shard {i + 1}/{shards}" for i in range(shards)], speed)
        return f"Fetched {rows:,} rows of {name!r} in {shards} shards; 0.4% had missing values and were dropped."

    @tool(idempotent=True)
    async def train_model(model: str, epochs: int, ctx: ToolContext, request: int = 1) -> str | AgentToolResult:
        """Train a model for some epochs and return its validation score (takes about 6 s)."""
        failed = await _work_in_child(ctx, 6.0, [f"epoch {i + 1}/{epochs}" for i in range(epochs)], speed)
        if failed is not None:
            return failed
        return f"Trained {model!r} for {epochs} epochs; validation accuracy 0.87, loss 0.31."

    @tool(idempotent=True)
    async def write_report(title: str, sections: int, ctx: ToolContext, request: int = 1) -> str:
        """Write a report with some sections and return where it was saved (takes about 3 s)."""
        await _work(ctx, 3.0, [f"writing section {i + 1}/{sections}" for i in range(sections)], speed)
        slug = "-".join(title.lower().split())[:40] or "report"
        return f"Wrote {sections} sections to reports/{slug}.md."

    return [fetch_dataset, train_model, write_report]
