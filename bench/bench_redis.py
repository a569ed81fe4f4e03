"""Benchmark: the Redis store's thread listing, append and load, on the server of this machine.

Run: ``.venv/bin/python -m bench.bench_redis [--url redis://127.0.0.1:6379/0] [--threads 10000]``

Writes ``--threads`` threads of 6 messages each (prompt, reply with a tool call, tool
output, twice) under a fresh key prefix through the store itself, then times
``list_threads`` (the picker's call), one append and one load of a thread; every key
under the prefix is deleted at the end. Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import redis.asyncio as aioredis

from core.checkpoint.redis import RedisCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text


def turn(n: int) -> list[object]:
    return [
        user_text(f"prompt {n}: look at the repository and tell me what is wrong"),
        AssistantMessage(
            content=[TextContent(text="Reading."), ToolCall(id=f"c{n}", name="read", arguments={"path": "x"})],
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id=f"c{n}", tool_name="read", content=[TextContent(text="line\n" * 20)]),
    ]


async def main(url: str, threads: int) -> None:
    prefix = f"cubepi-bench:{uuid.uuid4().hex[:8]}:"
    store = await RedisCheckpointer.open(url, prefix=prefix)
    try:
        started = time.perf_counter()
        for at in range(0, threads, 200):
            await asyncio.gather(
                *(store.append(f"t{n}", [*turn(n), *turn(n + 1)]) for n in range(at, min(at + 200, threads)))
            )
        print(f"wrote {threads} threads in {time.perf_counter() - started:.1f} s")
        listing = []
        for _ in range(5):
            t0 = time.perf_counter()
            found = await store.list_threads()
            listing.append(time.perf_counter() - t0)
        assert len(found) == threads
        print(f"list_threads ({threads} threads): median {statistics.median(listing) * 1000:.0f} ms")
        appends = []
        for i in range(200):
            t0 = time.perf_counter()
            await store.append("t0", [user_text(f"more {i}")])
            appends.append(time.perf_counter() - t0)
        print(f"append one message: median {statistics.median(appends) * 1e6:.0f} µs")
        t0 = time.perf_counter()
        await store.load("t0")
        print(f"load a 206-message thread: {(time.perf_counter() - t0) * 1000:.1f} ms")
    finally:
        await store.close()
        client = aioredis.from_url(url)
        keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
        for at in range(0, len(keys), 1000):
            await client.delete(*keys[at : at + 1000])
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--threads", type=int, default=10_000)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.threads))
