"""The demo agent: a scripted model and three slow tools, so everything works without an API key.

It lives in ``core`` so the headless runner (``python -m core.runner run --demo``) and the
app (``tui``) use the one same agent.

The model is a :class:`~core.providers.faux.FauxProvider` whose script is one function
that answers any conversation:

* a new prompt (or a follow-up): a few sentences, then ``fetch_dataset`` and
  ``train_model`` in parallel; a prompt "count words: TEXT" calls ``count_words`` (the
  lesson's two-step workflow) on TEXT instead;
* after those results: a sentence, then ``write_report``;
* after any other results (its own, or a foreign thread's unknown tools, including
  calls recovery recorded as interrupted): a final summary that quotes them;
* a steer that arrived since its last reply is acknowledged by quoting it.

The tools take several seconds each, report progress about every 0.2 s, stop at once
when the run is aborted, and are idempotent (same arguments, same result), so resume
may re-run them; each commits its progress as steps (:mod:`core.steps`: a shard, an
epoch, a section), so a re-run after a crash continues after the last committed step. ``train_model`` does its work in a real child process (a small Python
script printing one line per step) through :func:`core.processes.run_process`: an abort
ends the child's whole process group, and its result then says "aborted after start;
partial effects possible". Every call carries ``request``, the number of the prompt or follow-up
it serves: a new request is new work, while a resume re-runs (or reuses) the job of the
same request. ``speed`` scales every delay (tests use a large value).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from core.errors import ToolError
from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, UserMessage
from core.processes import run_process
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_thinking, faux_tool_call
from core.steps import run_steps
from core.tools import AgentToolResult, ToolContext, tool

SYSTEM_PROMPT = (
    "You are a careful data assistant. Use fetch_dataset and train_model (they may run in "
    "parallel), then write_report, then summarise what you did in a few sentences. Asked to "
    "count words, use count_words."
)
"""Given to every agent; the demo ignores it, a real model follows it."""

DELTA_DELAY = 0.03
"""Seconds between streamed deltas at speed 1 (a readable pace)."""

TICK = 0.2
"""Seconds between progress reports of a demo tool at speed 1."""

_FIRST_TOOLS = {"fetch_dataset", "train_model"}

_COUNT_WORDS = re.compile(r"\s*count\s+(?:the\s+)?words\b(?:\s+(?:of|in))?\s*:?\s*(.*)", re.IGNORECASE | re.DOTALL)
"""A prompt the demo model answers with ``count_words`` on the rest of its text."""


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
    counted = _COUNT_WORDS.fullmatch(latest.text) if latest is not None and kind == "prompt" else None
    if counted is not None and counted.group(1).strip():
        return faux_reply(
            faux_text(f"{ack}I will count the words in two steps: normalise the text, then count."),
            faux_tool_call("count_words", {"text": counted.group(1)}),
        )
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

DEMO_WORKFLOW = "demo-tools/2"
"""The workflow version of the demo tools' steps (:mod:`core.steps`): a step record of
another version is refused rather than continued by other steps."""

COUNT_WORDS_WORKFLOW = "count-words/1"
"""The workflow version of ``count_words``, the lesson's two steps."""


def normalise_text(text: str) -> dict[str, str]:
    """Step 1 of the lesson's workflow: the text lower-cased, its words separated by one
    space (``"Hello   Agent"`` -> ``{"normalized": "hello agent"}``)."""
    return {"normalized": " ".join(text.lower().split())}


def count_normalised_words(data: dict[str, str]) -> str:
    """Step 2 of the lesson's workflow: ``{"normalized": "hello agent"}`` -> ``"words=2"``."""
    return f"words={len(data['normalized'].split())}"


class _StepFailed(Exception):
    """A step of a demo tool ended without its work done (aborted, or its child failed);
    ``result`` is the error result the tool returns. The step is not committed."""

    def __init__(self, result: AgentToolResult) -> None:
        super().__init__(str(result.content))
        self.result = result


async def _ticks(ctx: ToolContext, count: int, seconds: float, report: Callable[[int], None]) -> None:
    """Wait ``count`` ticks of ``seconds / count`` each, calling ``report(i)`` after tick ``i``
    (0-based); raise ``ToolError`` at once on abort."""
    for i in range(count):
        try:
            await asyncio.wait_for(ctx.signal.wait(), timeout=seconds / count)
        except TimeoutError:
            pass
        if ctx.signal.is_set():
            raise ToolError("Stopped: the run was aborted.")
        report(i)


async def _work(ctx: ToolContext, seconds: float, labels: Sequence[str], speed: float) -> int:
    """Spend ``seconds / speed`` in one step per label, reporting progress and committing
    each step (``ctx.steps``), so a re-run continues after the last committed one; stop at
    once on abort. Returns how many steps are done (all of them)."""
    total = len(labels)
    per_step = seconds / total / speed
    ticks = max(1, round(seconds / total / TICK))

    def step(i: int) -> Callable[[Any], Awaitable[int]]:
        async def run(_done: Any) -> int:
            def report(t: int) -> None:
                ctx.report(progress=(i + (t + 1) / ticks) / total, text=labels[i])

            await _ticks(ctx, ticks, per_step, report)
            return i + 1

        return run

    return await run_steps(ctx.steps, [step(i) for i in range(total)], workflow=DEMO_WORKFLOW, initial=0)


# The child process of ``train_model``: prints each line (argv[2:]) after sleeping a tick (argv[1] s).
_TRAINER = (
    "import sys, time\nfor step in sys.argv[2:]:\n    time.sleep(float(sys.argv[1]))\n    print(step, flush=True)\n"
)


async def _work_in_children(ctx: ToolContext, seconds: float, labels: Sequence[str], speed: float) -> None:
    """Like :func:`_work`, each step done by a child process that prints one line per tick.
    Raises :class:`_StepFailed` with the error result when a child did not finish (aborted,
    or it failed); that step is not committed."""
    total = len(labels)
    ticks = max(1, round(seconds / total / TICK))

    def step(i: int) -> Callable[[Any], Awaitable[int]]:
        async def run(_done: Any) -> int:
            printed = 0

            def on_line(line: str) -> None:
                nonlocal printed
                printed += 1
                ctx.report(progress=(i + printed / ticks) / total, text=line)

            argv = [sys.executable, "-c", _TRAINER, str(seconds / total / ticks / speed), *[labels[i]] * ticks]
            outcome = await run_process(ctx, argv, on_line=on_line, label="the trainer process")
            result = outcome.tool_result()
            if result.is_error:
                # Its output is one line per tick so far: the first line says all a reader needs.
                raise _StepFailed(
                    AgentToolResult(str(result.content).split("\n")[0], details=result.details, is_error=True)
                )
            return i + 1

        return run

    await run_steps(ctx.steps, [step(i) for i in range(total)], workflow=DEMO_WORKFLOW, initial=0)


def demo_tools(speed: float = 1.0) -> list[Any]:
    """``fetch_dataset``, ``train_model``, ``write_report`` and ``count_words``, paced by
    ``speed``. The first three are long and commit a step per shard, epoch or section
    (:mod:`core.steps`), so resume continues a crashed call after its last committed step;
    ``count_words`` is the lesson's workflow (normalise the text, count its words)."""

    @tool(idempotent=True)
    async def fetch_dataset(name: str, rows: int, ctx: ToolContext, request: int = 1) -> str:
        """Download a dataset by name and return a short description (takes about 4 s)."""
        shards = 8
        await _work(ctx, 4.0, [f"downloading shard {i + 1}/{shards}" for i in range(shards)], speed)
        return f"Fetched {rows:,} rows of {name!r} in {shards} shards; 0.4% had missing values and were dropped."

    @tool(idempotent=True)
    async def train_model(model: str, epochs: int, ctx: ToolContext, request: int = 1) -> str | AgentToolResult:
        """Train a model for some epochs and return its validation score (takes about 6 s)."""
        try:
            await _work_in_children(ctx, 6.0, [f"epoch {i + 1}/{epochs}" for i in range(epochs)], speed)
        except _StepFailed as failed:
            return failed.result
        return f"Trained {model!r} for {epochs} epochs; validation accuracy 0.87, loss 0.31."

    @tool(idempotent=True)
    async def write_report(title: str, sections: int, ctx: ToolContext, request: int = 1) -> str:
        """Write a report with some sections and return where it was saved (takes about 3 s)."""
        await _work(ctx, 3.0, [f"writing section {i + 1}/{sections}" for i in range(sections)], speed)
        slug = "-".join(title.lower().split())[:40] or "report"
        return f"Wrote {sections} sections to reports/{slug}.md."

    @tool(idempotent=True)
    async def count_words(text: str, ctx: ToolContext) -> str:
        """Count the words of a text, in two committed steps: normalise it, then count."""
        return await run_steps(
            ctx.steps, [normalise_text, count_normalised_words], workflow=COUNT_WORDS_WORKFLOW, initial=text
        )

    return [fetch_dataset, train_model, write_report, count_words]
