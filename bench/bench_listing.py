"""Benchmark: the thread listing on every backend, at two thread lengths, full and incremental.

Run: ``.venv/bin/python -m bench.bench_listing [--threads 10000] [--messages 10,100] [--only sqlite,postgres,redis,memory]``

Each backend gets ``--threads`` threads of each ``--messages`` length (the realistic mix of
``bench_store.make_messages``: prompt, reply with a tool call, tool output, so each
thread's tail is its last reply and the two rows after it). Figures per backend and length:

* list: ms for ``list_threads`` (median and best of ``--repeat``), the median CPU ms of
  this process over the call (the store's connection thread included: steadier than the
  wall clock on a shared machine), and the message rows it decoded (counted through :mod:`core.checkpoint.codec`, so it is the same on a loaded
  machine: the cost that must not grow with messages per thread);
* versions / changed: where the store has ``ThreadVersions``, ms for ``thread_versions``
  and for ``summaries`` of the 10 threads written since (what ``watch_threads`` reads on
  each change after the first listing).

Postgres runs in a database of its own on ``CUBEPI_TEST_POSTGRES``, Redis under a key
prefix of its own on ``CUBEPI_TEST_REDIS``; both are dropped after. Not a test: it prints,
it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bench.bench_store import make_messages
from core.checkpoint.capabilities import ThreadVersions, supports
from core.messages import user_text
from tests.helpers.decodes import counting_decodes
from tests.helpers.services import postgres_database, redis_prefix

CHANGED = 10
"""Threads written between the full listing and the incremental one."""


async def seed(store: Any, n_threads: int, n_messages: int) -> None:
    """Give ``store`` ``n_threads`` threads of ``n_messages`` messages each (one append per thread)."""
    messages = make_messages(n_messages)
    for i in range(n_threads):
        await store.append(f"thread-{i:05d}", messages)


async def time_listing(store: Any, expect: int, repeat: int = 5) -> dict[str, float]:
    """``list_threads`` ``repeat`` times: median and best ms, median CPU ms (the whole
    process's, the store's threads included), and the rows one listing decodes."""
    times, cpu = [], []
    rows = 0
    for _ in range(repeat):
        with counting_decodes() as count:
            started, started_cpu = time.perf_counter(), time.process_time()
            listed = await store.list_threads()
            times.append((time.perf_counter() - started) * 1e3)
            cpu.append((time.process_time() - started_cpu) * 1e3)
        rows = count.rows
        if len(listed) != expect:
            raise RuntimeError(f"listed {len(listed)} threads, not {expect}")
        del listed  # freed here, not inside the next call's timing
    return {
        "list_ms": statistics.median(times),
        "list_best_ms": min(times),
        "list_cpu_ms": statistics.median(cpu),
        "decoded": rows,
    }


async def time_incremental(store: Any, repeat: int = 5) -> dict[str, float]:
    """Where the store has ``ThreadVersions``: ms of ``thread_versions`` and of ``summaries``
    of the :data:`CHANGED` threads written since the previous versions were read (medians)."""
    if not supports(store, ThreadVersions):
        return {}
    before = await store.thread_versions()
    for i in range(CHANGED):
        await store.append(f"thread-{i:05d}", [user_text("one more")])
    versions_ms, changed_ms = [], []
    moved: list[str] = []
    for _ in range(repeat):
        started = time.perf_counter()
        after = await store.thread_versions()
        versions_ms.append((time.perf_counter() - started) * 1e3)
        moved = [tid for tid, v in after.items() if before.get(tid) != v]
        started = time.perf_counter()
        await store.summaries(moved)
        changed_ms.append((time.perf_counter() - started) * 1e3)
    if len(moved) != CHANGED:
        raise RuntimeError(f"{len(moved)} versions moved, not {CHANGED}")
    return {"versions_ms": statistics.median(versions_ms), "changed_ms": statistics.median(changed_ms)}


@asynccontextmanager
async def _sqlite() -> AsyncIterator[Any]:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    with tempfile.TemporaryDirectory(prefix="cubepi-bench-") as tmp:
        store = await SQLiteCheckpointer.open(Path(tmp) / "list.sqlite", create=True)
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def _postgres() -> AsyncIterator[Any]:
    from core.checkpoint.postgres import PostgresCheckpointer

    async with postgres_database("benchlist") as url:
        store = await PostgresCheckpointer.open(url, create=True)
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def _redis() -> AsyncIterator[Any]:
    from core.checkpoint.redis import RedisCheckpointer

    async with redis_prefix("benchlist") as (url, prefix):
        store = await RedisCheckpointer.open(url, create=True, prefix=prefix)
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def _memory() -> AsyncIterator[Any]:
    from core.checkpoint.memory import MemoryCheckpointer

    yield MemoryCheckpointer()


BACKENDS: dict[str, Callable[[], Any]] = {"sqlite": _sqlite, "postgres": _postgres, "redis": _redis, "memory": _memory}


async def measure(backend: str, n_threads: int, n_messages: int, repeat: int) -> dict[str, float]:
    """Every figure of one backend at one thread length, on a fresh store."""
    async with BACKENDS[backend]() as store:
        started = time.perf_counter()
        await seed(store, n_threads, n_messages)
        figures = {"seed_s": time.perf_counter() - started}
        figures.update(await time_listing(store, n_threads, repeat))
        figures.update(await time_incremental(store, repeat))
        return figures


async def main(n_threads: int, lengths: list[int], only: list[str], repeat: int) -> None:
    print(f"list_threads over {n_threads:,} threads; ms are medians of {repeat}\n")
    print(
        f"{'backend':10}{'msgs':>6}{'list ms':>10}{'best ms':>10}{'cpu ms':>10}{'decoded':>10}"
        f"{'versions ms':>13}{'10 changed ms':>15}"
    )
    for backend in only:
        for n in lengths:
            f = await measure(backend, n_threads, n, repeat)
            cells = [f"{f['list_ms']:>10.1f}", f"{f['list_best_ms']:>10.1f}", f"{f['list_cpu_ms']:>10.1f}"]
            cells.append(f"{int(f['decoded']):>10}")
            cells += [f"{f[k]:>13.1f}" if k in f else f"{'-':>13}" for k in ("versions_ms",)]
            cells += [f"{f[k]:>15.1f}" if k in f else f"{'-':>15}" for k in ("changed_ms",)]
            print(f"{backend:10}{n:>6}" + "".join(cells), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--messages", default="10,100", help="comma-separated messages per thread")
    parser.add_argument("--only", default="sqlite,postgres,redis,memory")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.threads, [int(x) for x in args.messages.split(",")], args.only.split(","), args.repeat))
