"""Benchmark: persist one message, load 10,000, for our SQLite store and the naive pattern.

Run: ``.venv/bin/python -m bench.bench_store [--messages 10000] [--appends 2000]``

The baseline re-implements, faithfully and in this file, the pattern cubeloop's SQLite
checkpointer uses (DESIGN.md measured it at ~820 µs per message and ~251 ms per 10,000):
rollback journal with default ``synchronous``, no index on ``thread_id``, one
``execute`` per statement (each a hop to aiosqlite's thread), ``json.dumps(model_dump())``
to write, per-row ``json.loads`` + ``model_validate`` by role to read. Both stores get the
same messages: a realistic agent mix (prompt, reply with a tool call, tool output).
Appends are timed on a thread that already holds ``--messages`` rows, so the figure is
the cost at that history length. Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite

from core.checkpoint import codec
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import (
    AnyMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    user_text,
)

THREAD = "bench"
_ROLES: dict[str, Any] = {"user": UserMessage, "assistant": AssistantMessage, "tool_result": ToolResultMessage}


def make_messages(n: int) -> list[AnyMessage]:
    """``n`` messages cycling prompt -> reply with a tool call -> tool output (~0.2-0.7 kB each)."""
    out: list[AnyMessage] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(user_text(f"Step {i}: read the next file and summarise what changed.", run_id="run-1"))
        elif kind == 1:
            out.append(
                AssistantMessage(
                    content=[
                        TextContent(text=f"Reading file {i}."),
                        ToolCall(id=f"call_{i}", name="read_file", arguments={"path": f"src/mod_{i}.py"}),
                    ],
                    stop_reason="tool_use",
                    usage=Usage(input_tokens=1200 + i, output_tokens=40),
                    provider_id="faux",
                    model_id="faux-1",
                    run_id="run-1",
                )
            )
        else:
            body = f"def handler_{i}(request):\n    return respond(request, status=200)\n" * 6
            out.append(
                ToolResultMessage(
                    tool_call_id=f"call_{i - 1}",
                    tool_name="read_file",
                    content=[TextContent(text=body)],
                    run_id="run-1",
                )
            )
    return out


class NaiveStore:
    """The baseline: cubeloop's SQLite checkpointer pattern, re-implemented here."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        self.lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> NaiveStore:
        db = await aiosqlite.connect(path)
        await db.execute("PRAGMA busy_timeout = 5000")
        await db.execute(
            "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL,"
            " message_json TEXT NOT NULL, created_at REAL NOT NULL DEFAULT (julianday('now')), run_id TEXT)"
        )
        await db.execute(
            "CREATE TABLE IF NOT EXISTS runs (thread_id TEXT NOT NULL, run_id TEXT NOT NULL,"
            " claimed_at REAL NOT NULL DEFAULT (julianday('now')), completed_at REAL, completion_seq INTEGER,"
            " PRIMARY KEY (thread_id, run_id))"
        )
        await db.commit()
        return cls(db)

    async def append(self, thread_id: str, messages: list[AnyMessage]) -> None:
        run_ids = {m.run_id for m in messages if m.run_id}
        async with self.lock:
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                if run_ids:
                    marks = ",".join("?" for _ in run_ids)
                    cur = await self.db.execute(
                        f"SELECT run_id FROM runs WHERE thread_id = ? AND run_id IN ({marks}) AND completed_at IS NOT NULL",
                        (thread_id, *run_ids),
                    )
                    if await cur.fetchall():
                        raise RuntimeError("run completed")
                for m in messages:
                    await self.db.execute(
                        "INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)",
                        (thread_id, json.dumps(m.model_dump()), m.run_id),
                    )
            except BaseException:
                await self.db.rollback()
                raise
            await self.db.commit()

    async def load(self, thread_id: str) -> list[AnyMessage]:
        async with self.lock:
            cur = await self.db.execute(
                "SELECT message_json FROM messages WHERE thread_id = ? ORDER BY id", (thread_id,)
            )
            rows = await cur.fetchall()
        out = []
        for (text,) in rows:
            data = json.loads(text)
            out.append(_ROLES[data["role"]].model_validate(data))
        return out

    async def close(self) -> None:
        await self.db.close()


async def seed(
    append: Callable[[str, list[AnyMessage]], Awaitable[None]], messages: list[AnyMessage], thread: str = THREAD
) -> None:
    for start in range(0, len(messages), 500):
        await append(thread, messages[start : start + 500])


async def time_appends(
    append: Callable[[str, list[AnyMessage]], Awaitable[None]], messages: list[AnyMessage], thread: str
) -> float:
    """Mean µs per message, each appended in its own call (as the agent does at message_end)."""
    started = time.perf_counter()
    for m in messages:
        await append(thread, [m])
    return (time.perf_counter() - started) / len(messages) * 1e6


async def time_load(load: Callable[[str], Awaitable[Any]], expect: int, repeat: int = 5) -> tuple[float, float]:
    """Best and median ms of ``repeat`` loads of the ``load`` thread."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = await load("load")
        times.append((time.perf_counter() - started) * 1e3)
        count = len(result.messages) if hasattr(result, "messages") else len(result)
        assert count == expect, (count, expect)
    return min(times), statistics.median(times)


async def main(n_messages: int, n_appends: int) -> None:
    history = make_messages(n_messages)
    extra = make_messages(n_appends)
    with tempfile.TemporaryDirectory(prefix="cubepi-bench-") as tmp:
        ours = await SQLiteCheckpointer.open(Path(tmp) / "ours.sqlite")
        naive = await NaiveStore.open(Path(tmp) / "naive.sqlite")
        for store in (ours, naive):  # warm up: first statements, WAL and page growth
            await time_appends(store.append, extra[:200], "warm-up")
        fresh = {
            "ours": await time_appends(ours.append, extra, "fresh"),
            "naive": await time_appends(naive.append, extra, "fresh"),
        }
        await seed(ours.append, history)
        await seed(naive.append, history)
        long = {
            "ours": await time_appends(ours.append, extra, THREAD),
            "naive": await time_appends(naive.append, extra, THREAD),
        }
        await seed(ours.append, history, "load")
        await seed(naive.append, history, "load")
        load = {"ours": await time_load(ours.load, n_messages), "naive": await time_load(naive.load, n_messages)}
        await ours.close()
        await naive.close()

    rows = [codec.encode(m).encode() for m in history]
    parse_ms = _timed(lambda: json.loads(b"[" + b",".join(rows) + b"]"))
    decode_ms = _timed(lambda: [codec.decode(r) for r in rows])

    size = sum(map(len, rows)) / len(rows)
    print(
        f"{n_messages:,} messages per thread (mean {size:.0f} bytes of JSON); {n_appends:,} timed appends, one per call\n"
    )
    print(f"{'':36}{'ours':>9}{'naive':>9}{'naive/ours':>12}{'target':>8}")
    for label, figures, _unit, target in (
        ("append to a new thread, µs/msg", fresh, "", "≤150"),
        (f"append after {n_messages:,} rows, µs/msg", long, "", "≤150"),
        (f"load {n_messages:,}, ms, best of 5", {k: v[0] for k, v in load.items()}, "", "≤40"),
        (f"load {n_messages:,}, ms, median of 5", {k: v[1] for k, v in load.items()}, "", ""),
    ):
        ratio = figures["naive"] / figures["ours"]
        print(f"{label:36}{figures['ours']:>9.0f}{figures['naive']:>9.0f}{ratio:>11.1f}x{target:>8}")
    print(
        f"\nwhat a load cannot avoid here, collector paused: json.loads of the rows {parse_ms:.0f} ms, "
        f"codec.decode row by row {decode_ms:.0f} ms"
    )


def _timed(fn: Callable[[], object], repeat: int = 3) -> float:
    """Best ms of ``repeat`` runs of ``fn`` with the cyclic collector paused."""
    best = float("inf")
    for _ in range(repeat):
        gc.disable()
        started = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - started) * 1e3)
        gc.enable()
        gc.collect()
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2_000)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.appends))
