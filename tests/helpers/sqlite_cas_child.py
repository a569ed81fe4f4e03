"""Child process for ``tests/core/checkpoint/test_sqlite_owners.py``: compare-and-set writes
on our SQLite store, killed between the UPDATE and the COMMIT, or raced by many processes.

Usage (from the repository root):

* ``python -m tests.helpers.sqlite_cas_child crash DB WHAT EXPECTED`` - open ``DB`` for owner
  ``alice`` and make one compare-and-set write of thread ``t`` (``WHAT``: ``step_commit`` of
  job ``job:crash`` or ``save_extra``) expecting revision ``EXPECTED``, with the store's
  ``_before_commit`` seam set to print ``MARK inside:<revision the update wrote>`` and
  ``MARK before_commit``, then sleep (its parent SIGKILLs it there, inside the transaction).
* ``python -m tests.helpers.sqlite_cas_child race DB KIND GO WRITERS FIRST`` - open
  ``WRITERS`` store objects on ``DB`` (owner ``alice``), print ``MARK ready``, wait for the
  file ``GO`` to exist, then run writers ``FIRST .. FIRST+WRITERS-1`` at once, each on its
  own store object: read the revision (``KIND`` ``extra``: the extra's; ``steps``: job
  ``job:race``'s step record), wait a few random milliseconds and write once expecting it.
  Prints ``RESULT <json>``: ``{"applied": {writer: new revision}, "conflicts": n}``, then
  ``MARK done``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import ConflictError

OWNER = "alice"
THREAD = "t"
CRASH_KEY = "job:crash"
RACE_KEY = "job:race"
WORKFLOW = "w1"
GO_WAIT = 120.0
"""Seconds a racer waits for the go file (a liveness bound)."""


def mark(name: str) -> None:
    print(f"MARK {name}", flush=True)


async def crash(db: str, what: str, expected: int) -> None:
    store = await SQLiteCheckpointer.open(db, create=False, owner=OWNER)

    def seam(name: str, c: sqlite3.Connection) -> None:
        if name == "step_commit":
            (revision,) = c.execute(
                "SELECT revision FROM cubepi_steps WHERE thread_id = ? AND key = ?", (THREAD, CRASH_KEY)
            ).fetchone()
        else:
            (revision,) = c.execute(
                "SELECT extra_revision FROM cubepi_thread_records WHERE thread_id = ?", (THREAD,)
            ).fetchone()
        mark(f"inside:{revision}")
        mark("before_commit")
        time.sleep(3600)  # on the connection thread, holding the write lock: killed here

    store._before_commit = seam
    if what == "step_commit":
        await store.step_commit(
            THREAD,
            CRASH_KEY,
            expected_revision=expected,
            workflow=WORKFLOW,
            next_step=expected + 1,
            data={"killed": True},
        )
    else:
        await store.save_extra(THREAD, {"killed": True}, expected_revision=expected)
    mark("not killed")  # never reached: the parent kills at before_commit


async def race(db: str, kind: str, go: Path, writers: int, first: int) -> dict[str, Any]:
    stores = [await SQLiteCheckpointer.open(db, create=False, owner=OWNER, busy_timeout=10) for _ in range(writers)]
    rng = random.Random(f"{first}")
    applied: dict[int, int] = {}
    conflicts = 0
    mark("ready")
    deadline = time.monotonic() + GO_WAIT
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the go file {go} never appeared")
        await asyncio.sleep(0.001)

    async def writer(i: int, store: SQLiteCheckpointer) -> None:
        nonlocal conflicts
        if kind == "extra":
            data = await store.load(THREAD)
            assert data is not None
            seen: Any = data.extra_revision
        else:
            seen = await store.step_get(THREAD, RACE_KEY)
        await asyncio.sleep(rng.uniform(0, 0.005))
        try:
            if kind == "extra":
                applied[i] = await store.save_extra(THREAD, {f"w{i}": i}, expected_revision=seen)
            else:
                record = await store.step_commit(
                    THREAD,
                    RACE_KEY,
                    expected_revision=seen.revision,
                    workflow=WORKFLOW,
                    next_step=seen.next_step + 1,
                    data=[*seen.data, i],
                )
                applied[i] = record.revision
        except ConflictError as error:
            assert error.thread_id == THREAD and error.expected != error.actual, error
            conflicts += 1

    try:
        await asyncio.gather(*(writer(first + n, store) for n, store in enumerate(stores)))
    finally:
        for store in stores:
            await store.close()
    return {"applied": applied, "conflicts": conflicts}


def main(argv: list[str]) -> None:
    if argv[0] == "crash":
        asyncio.run(crash(argv[1], argv[2], int(argv[3])))
    elif argv[0] == "race":
        outcome = asyncio.run(race(argv[1], argv[2], Path(argv[3]), int(argv[4]), int(argv[5])))
        print("RESULT " + json.dumps(outcome), flush=True)
        mark("done")
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
