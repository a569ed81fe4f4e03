"""A child process that appends numbered messages to one thread of a PostgreSQL store.

``python -m tests.helpers.pg_appender URL THREAD NAME COUNT ours|cubeloop`` appends COUNT
user messages "NAME-0" ... one at a time (with our store, or with cubeloop 0.15.3's own
``PostgresCheckpointer``) and prints "done" at the end. Ours opens the unowned scope: a
thread cubeloop writes too is unowned (cubeloop records no owner), whoever writes first.
"""

from __future__ import annotations

import asyncio
import sys


async def _ours(url: str, thread: str, name: str, count: int) -> None:
    from core.checkpoint.postgres import PostgresCheckpointer
    from core.messages import user_text
    from core.owners import UNOWNED

    async with await PostgresCheckpointer.open(url, create=False, owner=UNOWNED) as store:
        for i in range(count):
            await store.append(thread, [user_text(f"{name}-{i}")])


async def _cubeloop(url: str, thread: str, name: str, count: int) -> None:
    from cubeloop.checkpointer.postgres import PostgresCheckpointer
    from cubeloop.providers.base import TextContent, UserMessage

    async with PostgresCheckpointer(url) as store:
        for i in range(count):
            await store.append(thread, [UserMessage(content=[TextContent(text=f"{name}-{i}")])])


def main() -> None:
    url, thread, name, count, who = sys.argv[1:6]
    run = _ours if who == "ours" else _cubeloop
    asyncio.run(run(url, thread, name, int(count)))
    print("done", flush=True)


if __name__ == "__main__":
    main()
