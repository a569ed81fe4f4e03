"""Benchmark: the Postgres store on the local server - append, load and the thread listing.

Run: ``.venv/bin/python -m bench.bench_postgres [--threads 10000] [--messages 10000]``
(server from ``CUBEPI_TEST_POSTGRES``, default ``postgresql://postgres@127.0.0.1:5432/test``;
a database is created for the run and dropped after).

Prints: the time of one ``append`` of a 4-message batch (median of 200), ``load`` of one
thread of ``--messages`` messages, and ``list_threads`` over ``--threads`` threads of 6
messages each (median of 5). Targets (issue 8): an append of a few ms, a 10,000-message
load and a 10,000-thread listing well under a second. Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from core.checkpoint.postgres import PostgresCheckpointer
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from tests.helpers.services import postgres_database


def _turn(i: int) -> list:
    return [
        user_text(f"question {i} " + "lorem ipsum " * 10),
        AssistantMessage(
            content=[TextContent(text="looking"), ToolCall(id=f"c{i}", name="read", arguments={"path": f"f{i}.py"})],
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id=f"c{i}", tool_name="read", content=[TextContent(text="x = 1\n" * 20)]),
    ]


async def main(threads: int, messages: int) -> None:
    async with postgres_database("bench") as url:
        store = await PostgresCheckpointer.open(url, create=True)
        try:
            times = []
            for i in range(200):
                started = time.perf_counter()
                await store.append("batch", [*_turn(i), AssistantMessage(content=[TextContent(text="done")])])
                times.append(time.perf_counter() - started)
            print(f"append (4 messages): median {statistics.median(times) * 1000:.2f} ms")

            batch = 500
            for start in range(0, messages, batch):
                turns = [m for i in range(start, start + batch, 3) for m in _turn(i)]
                await store.append("long", turns[: min(batch, messages - start)])
            started = time.perf_counter()
            data = await store.load("long")
            print(f"load ({len(data.messages)} messages): {(time.perf_counter() - started) * 1000:.0f} ms")

            made = 0
            while made < threads:
                chunk = range(made, min(made + 50, threads))
                await asyncio.gather(*(store.append(f"t{i}", [*_turn(i), *_turn(i + 1)]) for i in chunk))
                made = chunk.stop
            times = []
            for _ in range(5):
                started = time.perf_counter()
                listed = await store.list_threads()
                times.append(time.perf_counter() - started)
            print(f"list_threads ({len(listed)} threads): median {statistics.median(times) * 1000:.0f} ms")
        finally:
            await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=10000)
    parser.add_argument("--messages", type=int, default=10000)
    args = parser.parse_args()
    asyncio.run(main(args.threads, args.messages))
