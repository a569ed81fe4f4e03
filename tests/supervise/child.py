"""The agent the subprocess tests run in a child process, paced by gate files.

Used two ways:

* ``python -m core.runner run --db DB --thread T --agent tests.supervise.child:make_agent PROMPT``
  (the real runner CLI with this agent);
* ``python -m tests.supervise.child DB THREAD PROMPT HOST TTL HEARTBEAT``: the same through
  ``run_headless`` with a lease holder claiming to run on ``HOST`` (so a test can watch a
  lease expire instead of its holder's pid vanish).

Environment (all optional): ``CUBEPI_TEST_GATES`` the gate directory; ``CUBEPI_TEST_TURNS``
how many replies call the tool before the final one (default 1); ``CUBEPI_TEST_PAUSE=1``
pauses each reply ``k`` halfway through its text until ``resume-k`` exists, and
``CUBEPI_TEST_PAUSE=n`` pauses it ``n`` times, at 1/(n+1), 2/(n+1), ... of its text, until
``resume-k``, ``resume-k-2``, ..., ``resume-k-n`` exist (:func:`pause_points`, :func:`pause_gate`:
a test knows exactly which text a follower must show at each pause);
``CUBEPI_TEST_STUBBORN=1`` makes the tool ignore an abort until ``honor-abort`` exists.
When the runner's Supervisor queues a steer, note or follow-up with its agent (to be
delivered at the next turn boundary), ``queued-SEQ`` is written (its debug log, read by
:class:`QueuedMarks`), so a test knows the runner has it before it lets the tool end.

Reply ``k`` (1-based) streams :func:`reply_text` in 4-character deltas, then calls ``work``
with ``label="k"``; the tool writes ``started-k``, reports progress every 0.05 s and
returns once ``release-k`` exists. The final reply quotes every steer it saw.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from core.errors import ToolError
from core.events import StreamEnd, StreamEvent, TextDelta, ToolCallStart
from core.leases import LeaseHolder
from core.messages import AssistantMessage, TextContent, ToolCall, UserMessage
from core.providers.base import ModelRequest, error_reply
from core.runner import AgentSpec, run_headless
from core.tools import ToolContext, tool

FILLER = (
    "I am working through this carefully, one step at a time, and I report what I do as I go "
    "so that anyone watching can follow along while the work happens."
)


def _gates() -> Path:
    return Path(os.environ.get("CUBEPI_TEST_GATES", "."))


class QueuedMarks(logging.Handler):
    """Writes ``queued-SEQ`` in the gate directory for each command the Supervisor queues."""

    def emit(self, record: logging.LogRecord) -> None:
        seq = getattr(record, "command_seq", None)
        # Only where a test gave a gate directory: elsewhere nobody reads the marks, and
        # they would litter the working directory.
        if seq is not None and "CUBEPI_TEST_GATES" in os.environ:
            (_gates() / f"queued-{seq}").write_text("")


_supervisor_log = logging.getLogger("core.supervisor")
_supervisor_log.addHandler(QueuedMarks(logging.DEBUG))
_supervisor_log.setLevel(logging.DEBUG)  # the runner's own handler still shows warnings only


DELTA = 4
"""Characters per streamed delta."""


def reply_text(k: int) -> str:
    """The text of reply ``k`` when it calls the tool."""
    return f"Turn {k}: {FILLER}"


def pause_points(text: str, pauses: int) -> list[int]:
    """Where a reply of ``text`` pauses when ``CUBEPI_TEST_PAUSE=pauses``: before the delta
    at each returned offset; pause ``j`` (1-based) has streamed exactly ``text[:offset]``."""
    points = []
    for j in range(1, pauses + 1):
        cut = len(text) * j // (pauses + 1)
        points.append(-(-cut // DELTA) * DELTA)  # the first delta starting at or after it
    return points


def pause_gate(k: int, j: int) -> str:
    """The gate file that ends pause ``j`` (1-based) of reply ``k``."""
    return f"resume-{k}" if j == 1 else f"resume-{k}-{j}"


async def _until(name: str, signal: asyncio.Event | None = None) -> None:
    path = _gates() / name
    while not path.exists():
        if signal is not None and signal.is_set():
            return
        await asyncio.sleep(0.02)


class GatedProvider:
    """Streams scripted replies; reply ``k`` may pause ``pause`` times (``True``: once,
    halfway) until its gates exist (see the module docstring)."""

    name = "gated"
    model = "gated-1"

    def __init__(self, turns: int, pause: bool | int) -> None:
        self.turns = turns
        self.pauses = int(pause)  # False/True: no pause / one pause halfway

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        k = 1 + sum(1 for m in request.messages if isinstance(m, AssistantMessage) and m.stop_reason == "tool_use")
        if k <= self.turns:
            text = reply_text(k)
            content: list = [
                TextContent(text=text),
                ToolCall(id=f"call_work_{k}", name="work", arguments={"label": str(k)}),
            ]
        else:
            steers = [
                m.text for m in request.messages if isinstance(m, UserMessage) and m.metadata.get("kind") == "steer"
            ]
            text = "All done." + (" Steers: " + "; ".join(steers) if steers else "")
            content = [TextContent(text=text)]
        points = pause_points(text, self.pauses)
        for i in range(0, len(text), DELTA):
            for j, point in enumerate(points, 1):
                if point == i:
                    await _until(pause_gate(k, j), signal)
            await asyncio.sleep(0.01)
            if signal.is_set():
                yield StreamEnd(
                    error_reply(
                        self, "Aborted by the user.", stop_reason="aborted", content=[TextContent(text=text[:i])]
                    )
                )
                return
            yield TextDelta(0, text[i : i + DELTA])
        for index, block in enumerate(content):
            if isinstance(block, ToolCall):
                yield ToolCallStart(index, block.id, block.name)
        reply = AssistantMessage(
            content=content,
            stop_reason="tool_use" if len(content) > 1 else "stop",
            provider_id=self.name,
            model_id=self.model,
        )
        yield StreamEnd(reply)


@tool
async def work(label: str, ctx: ToolContext) -> str:
    """Do some work until the test releases it."""
    (_gates() / f"started-{label}").write_text(ctx.tool_call_id)
    stubborn = os.environ.get("CUBEPI_TEST_STUBBORN") == "1"
    step = 0
    while not (_gates() / f"release-{label}").exists():
        if ctx.signal.is_set() and (not stubborn or (_gates() / "honor-abort").exists()):
            raise ToolError("Stopped: the run was aborted.")
        step += 1
        ctx.report(progress=min(step / 100, 0.99), text=f"step {step}")
        await asyncio.sleep(0.05)
    return f"work {label} done after {step} steps"


def make_agent() -> AgentSpec:
    """The runner's ``--agent`` factory."""
    turns = int(os.environ.get("CUBEPI_TEST_TURNS", "1"))
    return AgentSpec(GatedProvider(turns, int(os.environ.get("CUBEPI_TEST_PAUSE") or 0)), [work])


if __name__ == "__main__":
    db, thread, prompt, host, ttl, heartbeat = sys.argv[1:7]
    holder = LeaseHolder(host=host)
    sys.exit(
        asyncio.run(
            run_headless(
                db,
                thread,
                prompt,
                agent=make_agent,
                holder=holder,
                lease_ttl=float(ttl),
                heartbeat_interval=float(heartbeat),
            )
        )
    )
