"""Benchmark: what the agent loop costs per model call, at several history lengths.

Run: ``.venv/bin/python -m bench.bench_loop [--turns 300] [--lengths 0,1000,10000,100000]``

The loop (:func:`core.loop.run_loop`) runs on a transcript that already holds
``length`` messages (the realistic mix of ``bench_store``: prompt, reply with a tool
call, tool output), against a scripted provider that answers at once with a short
final reply, and an ``emit`` that does nothing, so what is timed is the loop's own
work per model call: settling, building the request, streaming the reply, recording
it. Each run delivers ``--turns`` follow-ups, one model call each. DESIGN.md's figure:
0.37 ms per model call, flat in history length. Not a test: it prints, it does not
assert.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import statistics
import time

from bench.bench_store import make_messages
from core.loop import LoopConfig, run_loop
from core.messages import AnyMessage, UserMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_text


async def _nothing(event: object) -> None:
    return None


async def per_call_ms(length: int, turns: int) -> tuple[float, float]:
    """(ms of the run's first model call, median ms per later model call) over ``turns``
    model calls on a ``length``-message history.

    The first call of a run pays once for what is proportional to the history (the
    scripted provider's token count, the request builder's first pass); the later ones
    are what a long run pays per model call, and must not grow with the history.
    """
    history: list[AnyMessage] = make_messages(length)
    if length % 3 == 2:
        history = history[:-1]  # end on a settled turn, never on a bare tool call
    queue = [user_text(f"follow-up {i}") for i in range(turns - 1)]
    stamps: list[float] = []

    async def follow_ups() -> list[UserMessage]:
        return [queue.pop()] if queue else []

    def answer(request: object) -> object:
        stamps.append(time.perf_counter())
        return faux_reply(faux_text("ok"))

    provider = FauxProvider(fallback=answer, record=False, chunk_size=64)  # type: ignore[arg-type]
    config = LoopConfig(provider, run_id="bench", get_follow_ups=follow_ups)
    gc.collect()
    gc.freeze()  # the history is old objects: keep the collector's walks of them out of the figure
    started = time.perf_counter()
    await run_loop(history, config, _nothing, asyncio.Event(), [user_text("go")])
    gc.unfreeze()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return (stamps[0] - started) * 1000, statistics.median(gaps) * 1000


async def main(turns: int, lengths: list[int]) -> None:
    print(f"{turns} model calls per run; median of 3 runs\n")
    print(f"{'history':>10}  {'first call ms':>14}  {'ms per later model call':>24}")
    for length in lengths:
        figures = [await per_call_ms(length, turns) for _ in range(3)]
        first = statistics.median(f[0] for f in figures)
        later = statistics.median(f[1] for f in figures)
        print(f"{length:>10,}  {first:>14.2f}  {later:>24.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--lengths", default="0,1000,10000,100000")
    args = parser.parse_args()
    asyncio.run(main(args.turns, [int(x) for x in args.lengths.split(",")]))
