"""Benchmark: append, load (1k, 10k) and listing 10,000 threads on every backend, beside cubeloop.

Run: ``.venv/bin/python -m bench.bench_backends [--threads 10000] [--appends 500] [--only sqlite,postgres]``

Backends: our SQLite, Postgres and Redis stores, and in the same run the peers: cubeloop
0.15.3's own ``PostgresCheckpointer`` and ``SQLiteCheckpointer`` (the real package, its
Postgres schema created from its own SQLAlchemy metadata). Postgres runs against the
server at ``CUBEPI_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
in a database of its own, Redis at ``CUBEPI_TEST_REDIS`` under a key prefix of its own;
both are dropped after. Figures:

* append: µs per message, one message per call (as the agent persists at ``message_end``)
  on a thread that already holds 10,000 rows;
* load: ms for the whole thread of 1,000 and of 10,000 messages (best and median of 5);
* list: ms for ``list_threads`` over 10,000 threads of 4 messages each (best of 3);
  cubeloop has no thread listing, so its column says so.

The ratio columns are peer / ours on the same server in the same run (above 1: ours is
faster). Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_store import make_messages
from core.messages import AnyMessage, user_text
from tests.helpers.pg import make_cubeloop_schema
from tests.helpers.services import postgres_database, redis_prefix


@dataclass
class Subject:
    """One store under test: how to append and load, and how to list (``None``: it cannot)."""

    name: str
    append: Callable[[str, list[Any]], Awaitable[None]]
    load: Callable[[str], Awaitable[Any]]
    list_threads: Callable[[], Awaitable[list[Any]]] | None
    close: Callable[[], Awaitable[None]]
    convert: Callable[[list[AnyMessage]], list[Any]] = field(default=lambda messages: messages)


def to_cubeloop(messages: list[AnyMessage]) -> list[Any]:
    """Our messages as cubeloop's own classes (what its checkpointers accept)."""
    from cubeloop.providers.base import AssistantMessage, ToolResultMessage, UserMessage

    classes = {"user": UserMessage, "assistant": AssistantMessage, "tool_result": ToolResultMessage}
    return [classes[m.role].model_validate(m.model_dump(mode="json")) for m in messages]


async def _seed(subject: Subject, thread: str, messages: list[AnyMessage]) -> None:
    for start in range(0, len(messages), 500):
        await subject.append(thread, subject.convert(messages[start : start + 500]))


async def _time_appends(subject: Subject, messages: list[AnyMessage], thread: str) -> float:
    converted = [subject.convert([m]) for m in messages]
    started = time.perf_counter()
    for batch in converted:
        await subject.append(thread, batch)
    return (time.perf_counter() - started) / len(messages) * 1e6


async def _time_load(subject: Subject, thread: str, expect: int, repeat: int = 5) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        data = await subject.load(thread)
        times.append((time.perf_counter() - started) * 1e3)
        if len(data.messages) != expect:
            raise RuntimeError(f"{subject.name} loaded {len(data.messages)} messages of {thread}, not {expect}")
    return min(times), statistics.median(times)


async def _time_list(subject: Subject, expect: int, repeat: int = 3) -> float | None:
    if subject.list_threads is None:
        return None
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        rows = await subject.list_threads()
        best = min(best, (time.perf_counter() - started) * 1e3)
        if len(rows) < expect:
            raise RuntimeError(f"{subject.name} listed {len(rows)} threads, not {expect}")
    return best


async def measure(subject: Subject, n_threads: int, n_appends: int) -> dict[str, float | None]:
    """Every figure of one subject (see the module docstring)."""
    history = make_messages(10_000)
    await _time_appends(subject, make_messages(100), "warm-up")
    await _seed(subject, "long", history)
    figures: dict[str, float | None] = {"append": await _time_appends(subject, make_messages(n_appends), "long")}
    await _seed(subject, "load1k", history[:1000])
    figures["load1k"], figures["load1k_median"] = await _time_load(subject, "load1k", 1000)
    figures["load10k"], figures["load10k_median"] = await _time_load(subject, "long", 10_000 + n_appends)
    if subject.list_threads is not None:
        small = [user_text("Summarise the report."), *make_messages(3)[1:], user_text("Thanks, next one.")]
        started = time.perf_counter()
        for i in range(n_threads):
            await subject.append(f"thread-{i:05d}", subject.convert(small))
        figures["seed_s"] = time.perf_counter() - started
    figures["list"] = await _time_list(subject, n_threads)
    return figures


async def _ours_sqlite(directory: Path) -> Subject:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    store = await SQLiteCheckpointer.open(directory / "ours.sqlite", create=True)
    return Subject("sqlite", store.append, store.load, store.list_threads, store.close)


async def _cubeloop_sqlite(directory: Path) -> Subject:
    from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite

    store = CubeloopSQLite(str(directory / "cubeloop.sqlite"))
    await store.__aenter__()

    async def close() -> None:
        await store.__aexit__(None, None, None)

    return Subject("cubeloop sqlite", store.append, store.load, None, close, to_cubeloop)


async def _ours_postgres(url: str) -> Subject:
    from core.checkpoint.postgres import PostgresCheckpointer

    store = await PostgresCheckpointer.open(url, create=True)
    return Subject("postgres", store.append, store.load, store.list_threads, store.close)


async def _cubeloop_postgres(url: str) -> Subject:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres

    await make_cubeloop_schema(url)
    store = CubeloopPostgres(url)
    await store.__aenter__()

    async def close() -> None:
        await store.__aexit__(None, None, None)

    return Subject("cubeloop postgres", store.append, store.load, None, close, to_cubeloop)


async def _ours_redis(url: str, prefix: str) -> Subject:
    from core.checkpoint.redis import RedisCheckpointer

    store = await RedisCheckpointer.open(url, create=True, prefix=prefix)
    return Subject("redis", store.append, store.load, store.list_threads, store.close)


async def _run(make: Callable[[], Awaitable[Subject]], n_threads: int, n_appends: int) -> dict[str, float | None]:
    subject = await make()
    try:
        return await measure(subject, n_threads, n_appends)
    finally:
        await subject.close()


async def main(n_threads: int, n_appends: int, only: set[str] | None) -> None:
    results: dict[str, dict[str, float | None]] = {}

    def wanted(name: str) -> bool:
        return only is None or name in only

    with tempfile.TemporaryDirectory(prefix="cubepi-bench-") as tmp:
        if wanted("sqlite"):
            results["sqlite"] = await _run(lambda: _ours_sqlite(Path(tmp)), n_threads, n_appends)
            results["cubeloop sqlite"] = await _run(lambda: _cubeloop_sqlite(Path(tmp)), n_threads, n_appends)
    if wanted("postgres"):
        async with postgres_database("bench") as url:
            results["postgres"] = await _run(lambda: _ours_postgres(url), n_threads, n_appends)
        async with postgres_database("benchpeer") as url:
            results["cubeloop postgres"] = await _run(lambda: _cubeloop_postgres(url), n_threads, n_appends)
    if wanted("redis"):
        async with redis_prefix("bench") as (url, prefix):
            results["redis"] = await _run(lambda: _ours_redis(url, prefix), n_threads, n_appends)
    _print(results, n_threads, n_appends)


def _print(results: dict[str, dict[str, float | None]], n_threads: int, n_appends: int) -> None:
    names = list(results)
    print(f"append: {n_appends} single-message calls on a 10,000-row thread; list: {n_threads:,} threads\n")
    print(f"{'':34}" + "".join(f"{n:>19}" for n in names))
    rows = (
        ("append after 10k rows, µs/msg", "append"),
        ("load 1,000, ms (best of 5)", "load1k"),
        ("load 10,000, ms (best of 5)", "load10k"),
        ("load 10,000, ms (median of 5)", "load10k_median"),
        (f"list {n_threads:,} threads, ms (best of 3)", "list"),
    )
    for label, key in rows:
        cells = []
        for name in names:
            value = results[name].get(key)
            cells.append(f"{'no listing':>19}" if value is None else f"{value:>19.1f}")
        print(f"{label:34}" + "".join(cells))
    print()
    for ours, peer in (("sqlite", "cubeloop sqlite"), ("postgres", "cubeloop postgres")):
        if ours in results and peer in results:
            ratios = ", ".join(
                f"{key} ×{results[peer][key] / results[ours][key]:.2f}"  # type: ignore[operator]
                for _label, key in rows
                if results[peer].get(key) and results[ours].get(key)
            )
            print(f"{peer} / {ours} (above 1: ours is faster): {ratios}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--only", default=None, help="comma-separated: sqlite, postgres, redis")
    args = parser.parse_args()
    asyncio.run(main(args.threads, args.appends, set(args.only.split(",")) if args.only else None))
