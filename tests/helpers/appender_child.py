"""A child process that appends tagged messages to one thread: ``python -m tests.helpers.appender_child
LOCATION THREAD TAG COUNT BATCH``.

Opens the store at LOCATION (:func:`tests.helpers.store_locations.open_location`) and
appends COUNT user messages whose text is ``TAG:0``, ``TAG:1``, ... in calls of BATCH
messages, each call as the agent makes it (one transaction); extra key ``TAG`` is merged
after every call. Exits 0 after printing ``done``.
"""

from __future__ import annotations

import asyncio
import sys

from core.messages import user_text
from tests.helpers.store_locations import open_location


async def main(location: str, thread_id: str, tag: str, count: int, batch: int) -> None:
    store = await open_location(location, create=False)
    try:
        for start in range(0, count, batch):
            await store.append(thread_id, [user_text(f"{tag}:{i}") for i in range(start, min(count, start + batch))])
            await store.save_extra(thread_id, {tag: start})
    finally:
        await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    location, thread, tag, count, batch = sys.argv[1:6]
    asyncio.run(main(location, thread, tag, int(count), int(batch)))
