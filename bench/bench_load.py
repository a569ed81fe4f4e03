"""Benchmark: a load of one long SQLite thread and the operation after it, with the collector's share.

Run: ``.venv/bin/python -m bench.bench_load [--messages 10000] [--repeat 9]``

A load allocates tens of thousands of tracked objects (models, their dicts and sets); what
the cyclic collector then does with them is paid inside the load or by whatever runs next,
so both are timed: each round loads the thread (kept, as the app keeps an open thread), then
runs a "next operation" that allocates ~50,000 containers (as the app's next work would),
then a full collection. Per round: wall and CPU ms of the load, collector ms inside it, CPU
ms of the next operation and collector ms inside it, CPU ms of the full collection; the
medians are printed. Messages: ``bench.bench_store.make_messages``. Not a test: it prints,
it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_store import make_messages, seed
from core.checkpoint.sqlite import SQLiteCheckpointer


class _CollectorClock:
    """Sums the thread CPU time of every collection (``gc.callbacks``), in ms."""

    def __init__(self) -> None:
        self.ms = 0.0
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.ms += (time.thread_time() - self._started) * 1e3


async def main(n_messages: int, repeat: int) -> None:
    clock = _CollectorClock()
    figures: dict[str, list[float]] = {
        k: []
        for k in (
            "load wall",
            "load CPU",
            "in load: collector",
            "next op CPU",
            "in next op: collector",
            "full collection",
        )
    }
    with tempfile.TemporaryDirectory(prefix="cubepi-bench-") as tmp:
        store = await SQLiteCheckpointer.open(Path(tmp) / "load.sqlite")
        await seed(store.append, make_messages(n_messages), "load")
        await store.load("load")  # warm up: pages, statements
        kept: list[Any] = []
        gc.callbacks.append(clock)
        try:
            for _ in range(repeat):
                kept.clear()
                gc.collect()
                clock.ms = 0.0
                wall, cpu = time.perf_counter(), time.process_time()
                kept.append(await store.load("load"))
                loaded_wall, loaded_cpu, in_load = time.perf_counter(), time.process_time(), clock.ms
                junk = [[i, {"k": i}] for i in range(25_000)]
                del junk
                next_cpu, in_next = time.process_time(), clock.ms
                gc.collect()
                full_cpu = time.process_time()
                assert len(kept[0].messages) == n_messages
                for key, value in (
                    ("load wall", loaded_wall - wall),
                    ("load CPU", loaded_cpu - cpu),
                    ("in load: collector", in_load / 1e3),
                    ("next op CPU", next_cpu - loaded_cpu),
                    ("in next op: collector", (in_next - in_load) / 1e3),
                    ("full collection", full_cpu - next_cpu),
                ):
                    figures[key].append(value * 1e3)
        finally:
            gc.callbacks.remove(clock)
            await store.close()
    print(f"load of {n_messages:,} messages (SQLite), then ~50,000 allocations; ms, median of {repeat}")
    for key, values in figures.items():
        print(f"  {key:24}{statistics.median(values):>8.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.repeat))
