"""A runner started while another process holds the database's write lock waits it out.

The store used to give up after about 11 s (5 attempts of SQLite's 2 s busy timeout plus
0.75 s of pauses), so a runner started under a longer lock exited at once with status 2.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.checkpoint.sqlite_file import LOCK_WAIT
from core.recovery import ThreadState, diagnose
from core.runner import EXIT_CODES, run_headless
from tests.helpers.locks import LockHolder
from tests.helpers.supervise import runner_argv

HELD = 14.0
"""Seconds the other process holds the lock: longer than the old ~11 s, well within LOCK_WAIT."""


async def test_a_runner_waits_out_a_write_lock_held_longer_than_the_old_limit(db: Path, spawn) -> None:
    assert HELD < LOCK_WAIT
    holder = LockHolder(db, HELD).start()
    try:
        argv = runner_argv(db, "t1", "--demo", "--speed", "25", "Summarise the sales")
        runner = spawn(db, "t1", argv=argv)
        status = await runner.wait(timeout=HELD + 60)
        out, err = runner.output()
        released_after = time.monotonic() - holder.held_at
        assert holder.wait() == 0
    finally:
        holder.stop()
    assert status == 0, err
    assert err == "" and out.splitlines()[-1] == "run completed"
    assert released_after >= HELD  # it really ran under the lock and waited for its release
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        data = await store.load("t1")
    finally:
        await store.close()
    assert data is not None and data.messages[0].text == "Summarise the sales"
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


MIDRUN_HELD = 20.0
"""Seconds the other process holds the lock mid-run: longer than the runner's 15 s lease."""


async def test_a_write_lock_held_past_the_lease_mid_run_loses_nothing(db: Path, spawn) -> None:
    # While the file is locked the heartbeat cannot renew the lease and it expires; nobody
    # could take it over meanwhile, so the run's writes after the lock still count as its own.
    runner = spawn(db, "t1", "Summarise the sales")
    await runner.file("started-1")  # the tool runs: the prompt and the first reply are saved
    holder = LockHolder(db, MIDRUN_HELD).start()
    try:
        runner.gate("release-1")  # the tool's result is ready while the file is locked
        status = await runner.wait(timeout=MIDRUN_HELD + 60)
        out, err = runner.output()
        released_after = time.monotonic() - holder.held_at
        assert holder.wait() == 0
    finally:
        holder.stop()
    assert status == 0, err
    assert err == "" and out.splitlines()[-1] == "run completed"
    assert released_after >= MIDRUN_HELD  # it waited the lock out
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        data = await store.load("t1")
    finally:
        await store.close()
    assert data is not None
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert data.messages[2].text.startswith("work 1 done") and data.messages[3].text == "All done."
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED


async def test_a_lock_held_past_the_wait_fails_the_run_in_one_plain_sentence(db: Path) -> None:
    # Exit 1 (the run failed, as the README's exit statuses say), not 2: the input was fine.
    # The wait is shortened here; the CLI waits LOCK_WAIT (60 s) the same way.
    out, err = io.StringIO(), io.StringIO()
    holder = LockHolder(db, 30.0).start()
    try:
        status = await run_headless(db, "t1", "Summarise the sales", demo=True, lock_wait=3.0, out=out, err=err)
        still_held = holder.proc is not None and holder.proc.poll() is None
    finally:
        holder.stop()
    assert still_held  # it gave up on its own budget
    assert status == EXIT_CODES["failed"] == 1
    (sentence,) = err.getvalue().splitlines()
    assert sentence.startswith(f"The database {db} stayed locked by another program for ")
    assert sentence.endswith(" s; try again when it is free.")
    store = await SQLiteCheckpointer.open(db, create=False)
    try:
        assert await store.load("t1") is None  # nothing of the run was written
    finally:
        await store.close()
