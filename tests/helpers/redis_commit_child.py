"""A child process killed between the update and the commit of a Redis compare-and-set write:
``python -m tests.helpers.redis_commit_child URL PREFIX OWNER THREAD WHAT EXPECTED``.

``WHAT`` is ``step`` (``step_commit`` of job key ``lesson`` with ``EXPECTED`` as the expected
revision) or ``extra`` (``save_extra(..., expected_revision=EXPECTED)``). The store's test
seam ``_before_commit`` prints ``MARK commit`` once every check made in Python has passed and
the write is about to be sent to the server as its one script, then sleeps: the parent
SIGKILLs the child there (see :func:`tests.helpers.children.run_marked`). Were it not killed,
the child would write and print ``MARK done``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from core.checkpoint.redis import RedisCheckpointer


def _at_commit(_what: str) -> None:
    print("MARK commit", flush=True)
    time.sleep(60)  # the parent kills us here, before the script is sent


async def main(url: str, prefix: str, owner: str, thread_id: str, what: str, expected: int) -> None:
    async with await RedisCheckpointer.open(url, prefix=prefix, owner=owner) as store:
        store._before_commit = _at_commit
        if what == "step":
            await store.step_commit(
                thread_id, "lesson", expected_revision=expected, workflow="lesson-v1", next_step=9, data="killed"
            )
        else:
            await store.save_extra(thread_id, {"killed": True}, expected_revision=expected)
    print("MARK done", flush=True)


if __name__ == "__main__":
    url, prefix, owner, thread_id, what, expected = sys.argv[1:7]
    asyncio.run(main(url, prefix, owner, thread_id, what, int(expected)))
