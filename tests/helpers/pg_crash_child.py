"""A child process that stops one compare-and-set write of a Postgres store between its
UPDATE and its COMMIT, to be SIGKILLed there.

``python -m tests.helpers.pg_crash_child URL THREAD step|extra EXPECTED`` opens the store at
``URL`` for the owner ``$CUBEPI_OWNER`` names, sets the store's ``_before_commit`` test seam
and makes one write of thread ``THREAD`` at revision ``EXPECTED``: ``step`` a
``step_commit`` of job ``job:crash`` (workflow ``w1``, next step ``EXPECTED + 1``, data
``{"child": true}``), ``extra`` a ``save_extra`` of ``{"child": true}``. Inside the write's
transaction, after its statements ran, the seam prints ``MARK backend-<pid>`` (the server
process holding the open transaction), ``MARK before-commit``, and sleeps ``HOLD`` seconds:
the parent kills it there. Reaching the end (the seam returned, the write committed) prints
``MARK done``, which the parent never wants to see.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

HOLD = 120.0
"""Seconds the seam holds the transaction open: far longer than the parent takes to kill."""

STEP_KEY = "job:crash"
WORKFLOW = "w1"
CHILD_DATA = {"child": True}


async def _hold(what: str, conn: Any) -> None:
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    print(f"MARK backend-{pid}", flush=True)
    print("MARK before-commit", flush=True)
    await asyncio.sleep(HOLD)


async def main(url: str, thread: str, what: str, expected: int) -> None:
    from core.checkpoint.postgres import PostgresCheckpointer

    async with await PostgresCheckpointer.open(url, create=False) as store:
        store._before_commit = _hold
        if what == "step":
            await store.step_commit(
                thread, STEP_KEY, expected_revision=expected, workflow=WORKFLOW, next_step=expected + 1, data=CHILD_DATA
            )
        else:
            await store.save_extra(thread, CHILD_DATA, expected_revision=expected)
    print("MARK done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
