"""Benchmark: what the thread picker costs now that it reads whole threads, not only tails.

Run: ``.venv/bin/python -m bench.bench_picker [--threads 1000] [--messages 20]``

A SQLite file holds ``--threads`` threads of ``--messages`` messages each (the realistic
mix of ``bench_store``). Measured with the app's own :class:`tui.session.Session`:

* the first ``rows()`` (the picker's first paint): one listing from tails plus one
  refinement budget (``tui.whole_diagnoses.REFINE_BUDGET``) of whole-thread diagnoses;
* the tail-only listing alone (what the first paint cost before whole diagnoses), for the ratio;
* the time until every row reads from its whole thread, refining a budget at a time as
  ``watch_rows`` does, and the longest single step (time the event loop is busy, so a
  key press may wait up to that long);
* a second ``rows()`` once everything is known (the cache hit path).

Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.bench_store import make_messages
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.recovery import diagnose
from tui.session import Session
from tui.session_config import SessionConfig


async def _fill(path: Path, threads: int, messages: int) -> None:
    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        batch = make_messages(messages)
        for i in range(threads):
            await store.append(f"t{i:05d}", batch)
    finally:
        await store.close()


async def main(threads: int, messages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "threads.sqlite"
        await _fill(path, threads, messages)
        store = await SQLiteCheckpointer.open(path, create=False)

        async def opened() -> SQLiteCheckpointer:
            return store

        session = Session(SessionConfig(open_store=opened, make_provider=lambda: None))
        await session.open()
        try:
            started = time.perf_counter()
            summaries = await store.list_threads()
            for s in summaries:
                diagnose(s.tail, s.runs, problems=s.problems, pending=s.pending_request, tail_only=True)
            tails_only = time.perf_counter() - started

            started = time.perf_counter()
            await session.rows()
            first = time.perf_counter() - started

            started = time.perf_counter()
            longest = 0.0
            more = True
            while more:
                step = time.perf_counter()
                more = await session.whole.refine(store, summaries)
                longest = max(longest, time.perf_counter() - step)
            refined = time.perf_counter() - started + first

            started = time.perf_counter()
            await session.rows()
            again = time.perf_counter() - started
        finally:
            await store.close()
    print(f"{threads:,} threads of {messages} messages")
    print(f"  first rows() (tails + one refinement budget) {first * 1000:8.1f} ms")
    print(
        f"  tail-only listing (before)                   {tails_only * 1000:8.1f} ms   first/before {first / tails_only:5.2f}"
    )
    print(
        f"  every row from its whole thread after        {refined * 1000:8.1f} ms   longest step {longest * 1000:.1f} ms"
    )
    print(
        f"  rows() once all are known (cache hits)       {again * 1000:8.1f} ms   again/before {again / tails_only:5.2f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.threads, args.messages))
