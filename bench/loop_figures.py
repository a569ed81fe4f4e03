"""Runtime figures beside cubeloop: the loop's cost per model call, and tool turns per second.

* Loop cost per model call on an N-message history: ours is
  :func:`bench.bench_loop.per_call_ms` (the loop alone, no store); cubeloop's is its
  ``Agent`` on the same history (``Agent(messages=...)``, no checkpointer), answered at
  once by its ``FauxProvider``, the run fed one follow-up per model call as ours is.
  Each sample is the gap between two model calls, in milliseconds.
* Tool turns per second: a fresh thread in a SQLite file, each model call answering with
  one call of a tool that returns at once, then a final reply after ``turns`` turns; ours
  is :class:`core.agent.Agent` on our store, cubeloop's its ``Agent`` on its own
  ``SQLiteCheckpointer``, each at its shipped durability or at an equal one (the
  :mod:`bench.peers` words). One sample is one run's turns divided by its seconds.

Nothing here asserts a speed.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from bench.bench_backends import to_cubeloop
from bench.bench_loop import per_call_ms
from bench.bench_store import make_messages
from bench.peers import Durability, our_durability, pragmas, set_durability
from core.checkpoint.sqlite import SQLiteCheckpointer


async def our_loop_ms(history: int, calls: int) -> list[float]:
    """Our loop's milliseconds per later model call (median of a run of ``calls`` calls on a
    ``history``-message transcript, see :func:`bench.bench_loop.per_call_ms`), one run."""
    _first, later = await per_call_ms(history, calls)
    return [later]


async def cubeloop_loop_ms(history: int, calls: int) -> list[float]:
    """Milliseconds between cubeloop's successive model calls in one run of ``calls``
    calls on a ``history``-message transcript (one sample per gap)."""
    from cubeloop import Agent
    from cubeloop.providers import FauxProvider
    from cubeloop.providers.base import TextContent, UserMessage
    from cubeloop.providers.faux import faux_assistant_message

    messages = make_messages(history)
    if history % 3 == 2:
        messages = messages[:-1]  # end on a settled turn, never on a bare tool call
    stamps: list[float] = []

    def answer(*_: Any) -> Any:
        stamps.append(time.perf_counter())
        return faux_assistant_message("ok")

    provider = FauxProvider(provider_id="faux")
    provider.set_responses([answer] * calls)
    agent = Agent(model=provider.model("faux-1"), messages=to_cubeloop(messages))
    for i in range(calls - 1):
        agent.follow_up(UserMessage(content=[TextContent(text=f"follow-up {i}")]))
    await agent.prompt("go")
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


# --- tool turns per second ----------------------------------------------------------------------


async def our_turns_per_s(directory: Path, turns: int, *, durable: bool = False) -> tuple[float, Durability]:
    """Tool turns per second of one run of ``turns`` turns on our SQLite store, and its durability."""
    from core.agent import Agent
    from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
    from core.tools import tool

    @tool
    async def echo(text: str) -> str:
        """Say the text back."""
        return text

    script = [faux_reply(faux_tool_call("echo", {"text": f"turn {i}"})) for i in range(turns)]
    provider = FauxProvider([*script, faux_reply(faux_text("done"))], record=False)
    path = directory / f"turns-ours-{turns}-{time.monotonic_ns()}.sqlite"
    async with await SQLiteCheckpointer.open(path, create=True, durable=durable) as store:
        durability = await our_durability(store)
        agent = Agent(provider, store, "turns", tools=[echo])
        started = time.perf_counter()
        outcome = await agent.prompt("go")
        seconds = time.perf_counter() - started
    if outcome != "completed":
        raise RuntimeError(f"our tool-turn run ended {outcome}.")
    return turns / seconds, durability


async def cubeloop_turns_per_s(directory: Path, turns: int, *, wal_normal: bool = False) -> tuple[float, Durability]:
    """The same for cubeloop's ``Agent`` on its ``SQLiteCheckpointer`` (as shipped, or WAL with NORMAL)."""
    from cubeloop import Agent, tool
    from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite
    from cubeloop.providers import FauxProvider
    from cubeloop.providers.faux import faux_assistant_message, faux_tool_call

    @tool
    async def echo(text: str) -> str:
        """Say the text back."""
        return text

    provider = FauxProvider(provider_id="faux")
    provider.set_responses(
        [
            *(
                faux_assistant_message([faux_tool_call("echo", {"text": f"turn {i}"})], stop_reason="tool_use")
                for i in range(turns)
            ),
            faux_assistant_message("done"),
        ]
    )
    path = directory / f"turns-cubeloop-{turns}-{time.monotonic_ns()}.sqlite"
    async with CubeloopSQLite(str(path)) as store:
        if wal_normal:
            await set_durability(store._db, wal=True, synchronous="NORMAL")
        durability = await pragmas(store._db)
        agent = Agent(model=provider.model("faux-1"), tools=[echo], checkpointer=store, thread_id="turns")
        started = time.perf_counter()
        await agent.prompt("go")
        seconds = time.perf_counter() - started
        data = await store.load("turns")
    results = sum(1 for m in data.messages if m.role == "tool_result") if data is not None else 0
    if results != turns:
        raise RuntimeError(f"cubeloop's tool-turn run saved {results} tool results of {turns}.")
    return turns / seconds, durability
