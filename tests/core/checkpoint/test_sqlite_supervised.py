"""SQLite-only supervision behaviour: real processes racing for leases and jobs, a process
killed mid-job, and changes seen across connections.

The contract itself (one process) is in ``test_contract.py``; these tests need more than
one connection or more than one process, which only a file-backed store has.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import RunAlreadyClaimedError
from core.messages import user_text
from tests.core.checkpoint import racers

ROOT = Path(__file__).resolve().parents[3]
ROUNDS = 50


def pid_gone(lease: Lease) -> bool:
    """``is_stale`` as a supervisor on the same host would write it: the holder's process is gone."""
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    return False


async def run_racers(target: Any, path: Path, rounds: int) -> dict[str, list[Any]]:
    """Start two spawned processes running ``target``; return each one's results by holder name."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=target, args=(str(path), name, rounds, barrier, out)) for name in ("left", "right")]
    for p in procs:
        p.start()

    def collect() -> dict[str, list[Any]]:
        got: dict[str, list[Any]] = {}
        deadline = time.monotonic() + 120
        while len(got) < len(procs) and time.monotonic() < deadline:
            try:
                name, results = out.get(timeout=0.5)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # a racer died (its traceback is on stderr); the other waits at the barrier
                continue
            got[name] = results
        return got

    try:
        results = await asyncio.to_thread(collect)
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 5)
            if p.exitcode is None:
                p.kill()
    assert sorted(results) == ["left", "right"], f"a racer failed (exit codes {[p.exitcode for p in procs]})"
    return results


async def test_two_processes_racing_for_a_lease_have_exactly_one_winner_each_round(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        long_ago = time.time() - 3600
        for i in range(ROUNDS):  # each round's thread is held by a crashed holder: both racers may take over
            await store.acquire_lease(
                Lease(f"race-{i}", "ghost", 1, "gone", None, long_ago, long_ago, long_ago + 1), is_stale=racers.expired
            )

    results = await run_racers(racers.race_leases, sqlite_path, ROUNDS)

    left, right = results["left"], results["right"]
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        leases = await store.list_leases()
    for (i, left_won, left_saw, _), (j, right_won, right_saw, _) in zip(left, right, strict=False):
        assert i == j
        assert left_won != right_won, f"round {i}: both or neither won"
        winner, loser_saw = ("left", right_saw) if left_won else ("right", left_saw)
        assert loser_saw == winner, f"round {i}: the loser was refused with a lease other than the winner's"
        assert leases[f"race-{i}"].holder_id == winner
    # The barrier made them race: both started each round within a few milliseconds.
    gaps = [abs(a[3] - b[3]) for a, b in zip(left, right, strict=False)]
    assert statistics.median(gaps) < 0.05, (
        f"the racers did not start together (median gap {statistics.median(gaps):.3f} s)"
    )


async def test_two_processes_beginning_one_job_give_exactly_one_fresh_start(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    await (await SQLiteCheckpointer.open(sqlite_path)).close()

    results = await run_racers(racers.race_jobs, sqlite_path, ROUNDS)

    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        for (i, left_attempts, left_status), (_, right_attempts, right_status) in zip(
            results["left"], results["right"], strict=False
        ):
            assert (left_status, right_status) == ("started", "started")
            assert sorted((left_attempts, right_attempts)) == [1, 2], f"round {i}: {left_attempts}, {right_attempts}"
            record = await store.job_get("jobs", f"k{i}")
            assert record is not None and (record.status, record.attempts) == ("started", 2)


_DIES_MID_JOB = """
import asyncio, os, sys, time
from core.checkpoint.base import Lease
from core.checkpoint.sqlite import SQLiteCheckpointer

async def main(path, marker):
    store = await SQLiteCheckpointer.open(path, create=False)
    now = time.time()
    await store.acquire_lease(Lease("t", "child", os.getpid(), "here", "r1", now, now, now + 3600), is_stale=lambda _: False)
    await store.record_tool_event("t", "call-1", "start", tool_name="deploy", run_id="r1", job_key="deploy:v2")
    record = await store.job_begin("t", "deploy:v2", tool_call_id="call-1")
    await store.append_live_events("t", "r1", [{"type": "tool_progress", "pct": 40}])
    open(marker, "w").write(str(record.attempts))
    await asyncio.sleep(3600)  # the work: never finishes, the process is killed here

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_process_killed_between_job_begin_and_finish_leaves_the_job_started(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    await (await SQLiteCheckpointer.open(sqlite_path)).close()
    marker = sqlite_path.parent / "started"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DIES_MID_JOB, str(sqlite_path), str(marker), cwd=ROOT
    )
    try:
        for _ in range(600):
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.05)
        assert marker.read_text() == "1", "the child never began the job"
    finally:
        child.send_signal(signal.SIGKILL)
        assert await child.wait() == -signal.SIGKILL

    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        record = await store.job_get("t", "deploy:v2")
        assert record is not None
        assert (record.status, record.attempts, record.finished_at, record.tool_call_id) == (
            "started",
            1,
            None,
            "call-1",
        )
        entry = (await store.load_journal("t"))["call-1"]  # type: ignore[index]
        assert entry.started_at is not None and entry.ended_at is None and entry.job_key == "deploy:v2"
        assert [e.data["pct"] for e in await store.read_live_events("t")] == [40]
        dead = await store.get_lease("t")
        assert dead is not None and dead.holder_id == "child" and dead.pid == child.pid
        with pytest.raises(RunAlreadyClaimedError):  # its lease has not expired ...
            await store.acquire_lease(_lease("t", "resumer"), is_stale=lambda cur: cur.expires_at < time.time())
        await store.acquire_lease(_lease("t", "resumer"), is_stale=pid_gone)  # ... but its process is gone
        again = await store.job_begin("t", "deploy:v2", tool_call_id="call-1")
        assert (again.status, again.attempts) == ("started", 2), "a later begin reports the interrupted start"
        await store.job_finish("t", "deploy:v2", "done", {"deployed": "v2"})
        assert (await store.job_begin("t", "deploy:v2")).result == {"deployed": "v2"}


def _lease(thread_id: str, holder: str) -> Lease:
    now = time.time()
    return Lease(thread_id, holder, os.getpid(), socket.gethostname(), "r2", now, now, now + 30)


async def test_change_token_sees_commits_of_other_connections(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    watcher = await SQLiteCheckpointer.open(sqlite_path)
    writer = await SQLiteCheckpointer.open(sqlite_path)
    token = await watcher.change_token()
    for write in (
        writer.append("t", [user_text("hi")]),
        writer.append_live_events("t", None, [{"type": "x"}]),
        writer.send_command("t", "abort"),
        writer.acquire_lease(_lease("t", "w"), is_stale=lambda _: False),
        writer.renew_lease("t", "w", time.time(), time.time() + 30),
    ):
        await write
        new = await watcher.change_token()
        assert new != token
        token = new
    await writer.load("t")
    assert await watcher.change_token() == token, "a read elsewhere is no change"
    await writer.close()
    await watcher.close()


async def test_a_lease_taken_in_another_process_stops_the_old_holders_renewals(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    first = await SQLiteCheckpointer.open(sqlite_path)
    second = await SQLiteCheckpointer.open(sqlite_path)
    expired_lease = Lease("t", "old", os.getpid(), "here", "r1", 0.0, 0.0, 1.0)
    await first.acquire_lease(expired_lease, is_stale=lambda _: False)
    await second.acquire_lease(_lease("t", "new"), is_stale=lambda cur: cur.expires_at < time.time())
    assert await first.renew_lease("t", "old", time.time(), time.time() + 30) is False
    assert (await first.get_lease("t")).holder_id == "new"  # type: ignore[union-attr]
    await first.release_lease("t", "old")  # not the holder: nothing happens
    assert (await second.get_lease("t")).holder_id == "new"  # type: ignore[union-attr]
    await first.close()
    await second.close()


async def test_live_event_log_stays_bounded_under_many_batches(sqlite_path: Path) -> None:
    sqlite_path.parent.mkdir()
    async with await SQLiteCheckpointer.open(sqlite_path) as store:
        for batch in range(200):
            await store.append_live_events(
                "t", "r1", [{"type": "text_delta", "i": batch * 5 + k} for k in range(5)], keep=50
            )
        events = await store.read_live_events("t")
        assert [e.data["i"] for e in events] == list(range(950, 1000))
        await store.prune_live_events("t")
        assert await store.read_live_events("t") == []
