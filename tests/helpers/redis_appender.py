"""A child process that appends to one thread of a Redis store: ``python -m tests.helpers.redis_appender
URL PREFIX THREAD LABEL BATCHES``.

Each batch is two user messages, ``LABEL:i:a`` and ``LABEL:i:b``, appended in one call, so
the parent can check every message arrived once, each writer's order held, and each batch
stayed together. Prints ``MARK done`` at the end (see :mod:`tests.helpers.children`).
"""

from __future__ import annotations

import asyncio
import sys

from core.checkpoint.redis import RedisCheckpointer
from core.messages import user_text


async def main(url: str, prefix: str, thread_id: str, label: str, batches: int) -> None:
    async with await RedisCheckpointer.open(url, prefix=prefix) as store:
        for i in range(batches):
            await store.append(thread_id, [user_text(f"{label}:{i}:a"), user_text(f"{label}:{i}:b")])
    print("MARK done", flush=True)


if __name__ == "__main__":
    url, prefix, thread_id, label, batches = sys.argv[1:6]
    asyncio.run(main(url, prefix, thread_id, label, int(batches)))
