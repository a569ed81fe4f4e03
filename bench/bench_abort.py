"""Benchmark: how long from ``Agent.abort()`` to the running tool's ``tool_execution_end``.

Run: ``.venv/bin/python -m bench.bench_abort [--runs 50] [--grace 0.2] [--store memory|sqlite]``

Each run is a real agent run (tool journal and lease included) on the in-memory store,
or on a fresh SQLite file (``--store sqlite``: every journal write reaches the disk):
the model asks for one tool; the tool reports progress and then waits for its abort
signal (as a tool that honours the signal does). The abort is sent from the listener of
that first progress event; the clock stops when the listener hears
``tool_execution_end`` (by then the journal end is written). The target is 100 ms.
A second series measures a tool that ignores the signal, which is cancelled after
``--grace`` seconds, so its latency is the grace plus the overhead.
Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.events import AgentEvent
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.tools import ToolContext, tool


@tool
async def honours(ctx: ToolContext) -> str:
    """Work until the run is aborted."""
    ctx.report(text="working")
    await ctx.signal.wait()
    return "stopped: abort signal received"


@tool
async def ignores(ctx: ToolContext) -> str:
    """Never look at the abort signal."""
    ctx.report(text="working")
    await asyncio.sleep(3600)
    return "never"


async def open_store(kind: str, directory: Path) -> Any:
    if kind == "memory":
        return MemoryCheckpointer()
    from core.checkpoint.sqlite import SQLiteCheckpointer

    return await SQLiteCheckpointer.open(directory / "bench.sqlite", create=True)


async def one_run(store: Any, thread: str, tool_name: str, grace: float) -> float:
    """Seconds from abort() to tool_execution_end in one fresh run (a new thread)."""
    provider = FauxProvider([faux_reply(faux_tool_call(tool_name))])
    agent = Agent(provider, store, thread, tools=[honours, ignores], abort_grace=grace)
    marks: dict[str, float] = {}

    def listener(event: AgentEvent) -> None:
        if event.type == "tool_execution_update" and "abort" not in marks:
            marks["abort"] = time.perf_counter()
            agent.abort()
        elif event.type == "tool_execution_end":
            marks["end"] = time.perf_counter()

    agent.subscribe(listener)
    outcome = await agent.prompt("go")
    if outcome != "aborted":
        raise RuntimeError(f"expected an aborted run, got {outcome!r}: {agent.state.error}")
    return marks["end"] - marks["abort"]


def report(label: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(f"{label:<46} runs {len(ms):>3}   median {statistics.median(ms):8.3f} ms   max {max(ms):8.3f} ms")


async def main(runs: int, grace: float, kind: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(kind, Path(tmp))
        try:
            await one_run(store, "warm-up", "honours", grace)  # imports, schemas, first allocations
            honoured = [await one_run(store, f"h{i}", "honours", grace) for i in range(runs)]
            cancelled = [await one_run(store, f"i{i}", "ignores", grace) for i in range(max(3, runs // 10))]
        finally:
            await store.close()
    print(f"store: {kind}")
    report("abort -> end, tool honours the signal", honoured)
    report(f"abort -> end, tool ignores it (grace {grace:g} s)", cancelled)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--grace", type=float, default=0.2, help="abort grace in seconds for the ignoring tool")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.grace, args.store))
