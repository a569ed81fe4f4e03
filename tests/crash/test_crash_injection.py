"""Crash injection: real children run a multi-tool agent on a store and are SIGKILLed at random.

Children are forked by a warm fork server (:mod:`tests.crash.forkserver`), several at a
time, each running a random scenario (:mod:`tests.crash.scenario`: 2-3 turns of parallel
or sequential batches mixing idempotent tools with external effects and tools that are
not idempotent, a faux model that streams with a delay per delta, sometimes a steer)
on one of two stores shared by two lanes each; some children run two threads at once in
one store, some are themselves resumers of a crashed thread. Each child is killed with
SIGKILL after a random delay. The test runs once per backend (``store_backend``: SQLite
files, a PostgreSQL database each, a Redis key prefix each; see ``tests/crash/conftest.py``);
children get the store's location string and open it through
:func:`tests.helpers.store_locations.open_location`. After every kill the test checks,
from the store as a second connection of this process reads it (``load``: the rows with
their ``message_ids``, opaque and increasing per thread, and the runs; never the objects
the resumer here uses):

a. every message the child reported as persisted is in the store, in order, right
   after the rows that existed before the child started, and those rows are unchanged;
b. ``diagnose`` names the crash point the persisted rows imply, computed here
   independently from roles and tool call ids; a dangling call whose tool body started
   (per the ledger) has a journal start;
c. resume (in this process) completes: outcome "completed", a final "stop" reply, one
   assistant message per scripted turn, diagnosis completed, no earlier row changed;
d. what ``core.jobs`` promises, checked on every attempt of an idempotent effect (the
   ledger's ``effect_attempts``, never deduplicated, with the attempting process and the
   time): each (thread, job key) was attempted by distinct processes; every attempt but
   the last was made by a child that was SIGKILLed (and reaped) before the key's job was
   recorded ``done`` - the documented crash window, the job still ``started`` - and the
   last one by the process that recorded it ``done``, before it did; no attempt ever came
   after ``done``. The external ledger that dedups on ``ctx.job_key`` then holds one effect
   per key (by its primary key: that count is what the outside world keeps, not a check of
   the job store). A call that is not idempotent never ran twice; a done job is reused,
   not re-run;
e. no tool call is ever without its result: in the final thread and in every request
   the resuming model received.

Seed: ``CUBEPI_CRASH_SEED`` (printed); kills: ``CUBEPI_CRASH_KILLS`` on SQLite (default
300), ``CUBEPI_CRASH_KILLS_NETWORK`` on Postgres and Redis (default 100: every write there
is a network round trip, and CI runs all three; 100 kills still give each crash point
dozens of hits); concurrent children: ``CUBEPI_CRASH_LANES`` (default 4).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint import codec
from core.checkpoint.base import Checkpointer
from core.errors import NothingToResumeError
from core.messages import AssistantMessage, ToolResultMessage
from core.recovery import CrashPoint, ThreadState, diagnose
from core.tool_execution import call_job_key
from tests.crash.scenario import (
    create_ledger,
    estimate_seconds,
    make_agent,
    make_scenario,
    prompt_text,
)
from tests.helpers.crash_report import REPORT
from tests.helpers.store_backends import settle
from tests.helpers.store_locations import open_location

ROOT = Path(__file__).resolve().parents[2]
KILLS = {
    "sqlite": int(os.environ.get("CUBEPI_CRASH_KILLS") or 300),
    "postgres": int(os.environ.get("CUBEPI_CRASH_KILLS_NETWORK") or 100),
    "redis": int(os.environ.get("CUBEPI_CRASH_KILLS_NETWORK") or 100),
}
"""SIGKILLs per run, by backend (see the module docstring)."""
LANES = int(os.environ.get("CUBEPI_CRASH_LANES") or 4)
SEED = int(os.environ.get("CUBEPI_CRASH_SEED") or random.SystemRandom().randrange(2**32))
MIN_PER_POINT = 8
RESUME_SPEED = 0.2
"""Tools of the resumer in this process sleep this fraction of their scripted time."""


# --- the fork server -------------------------------------------------------------------------


class ForkServer:
    """Client of :mod:`tests.crash.forkserver`: spawn a child, kill it by pid, learn how it died."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next = 0
        self._pids: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, stderr: Path) -> ForkServer:
        with stderr.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.crash.forkserver",
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert b"ready" in first, f"fork server failed to start: {first!r} {stderr.read_text()}"
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            if "pid" in msg:
                self._pids.pop(msg["id"]).set_result(msg["pid"])
            else:
                future = self._exit(msg["exit"])
                if not future.done():
                    future.set_result(msg)
        for future in [*self._pids.values(), *self._exits.values()]:
            if not future.done():
                future.set_exception(RuntimeError("the fork server died"))

    def _exit(self, pid: int) -> asyncio.Future[dict[str, Any]]:
        return self._exits.setdefault(pid, asyncio.get_running_loop().create_future())

    async def spawn(self, request: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self._next += 1
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pids[self._next] = future
        self.proc.stdin.write((json.dumps({"id": self._next, **request}) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(future, 30)

    async def kill(self, pid: int) -> dict[str, Any]:
        """SIGKILL the child ``pid`` (ours: children never exit on their own) and wait until reaped."""
        future = self._exit(pid)
        if not future.done():
            os.kill(pid, signal.SIGKILL)
        return await asyncio.wait_for(future, 30)

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        finally:
            self._reader.cancel()


# --- reading the store (a connection of its own) and the ledger file ---------------------------

Rows = list[tuple[Any, str]]
"""A thread's messages as stored: ``(message id, message JSON)`` in append order."""


async def stored_rows(reader: Checkpointer, thread_id: str) -> tuple[Rows, dict[str, bool]]:
    """The thread's rows and its runs (run id -> completed), as ``reader`` loads them.

    Every row must decode (no ``problems``) and carry its own id, the ids increasing in
    append order (they are opaque, but ordered per thread: ``load_after`` relies on it)."""
    data = await reader.load(thread_id)
    if data is None:
        return [], {}
    assert not data.problems, (thread_id, data.problems)
    ids = data.message_ids
    assert len(ids) == len(data.messages), (thread_id, len(ids), len(data.messages))
    assert all(a < b for a, b in pairwise(ids)), f"{thread_id}: message ids not increasing: {ids}"
    runs = {r.run_id: r.completed for r in data.runs}
    assert len(runs) == len(data.runs), f"{thread_id}: a run listed twice: {data.runs}"
    return [(i, codec.encode(m)) for i, m in zip(ids, data.messages, strict=True)], runs


def ledger_rows(ledger: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    c = sqlite3.connect(ledger, timeout=30)
    try:
        return c.execute(sql, params).fetchall()
    finally:
        c.close()


def tool_rows(ledger: Path, thread_id: str) -> Counter[str]:
    """Ledger rows per tool call id: body starts and ends plus effect attempts."""
    rows = ledger_rows(ledger, "SELECT tool_call_id FROM attempts WHERE thread_id = ?", thread_id)
    rows += ledger_rows(ledger, "SELECT tool_call_id FROM effect_attempts WHERE thread_id = ?", thread_id)
    return Counter(call_id for (call_id,) in rows)


@dataclass(frozen=True)
class Verdict:
    """Where a thread stands, from its rows alone: ``state`` "empty" / "completed" / "crashed"."""

    state: str
    point: int | None = None
    why: str = ""
    missing: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"point {self.point} ({self.why})" if self.point else self.state


def expected_verdict(rows: Rows, runs: dict[str, bool]) -> Verdict:
    """The crash point the persisted rows imply (DESIGN.md), computed without core.recovery."""
    messages = [json.loads(text) for _, text in rows]
    if not messages:
        return Verdict("empty")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or messages[-1]["role"] == "user":
        return Verdict("crashed", 1, "user message unanswered")
    assistant = messages[last]
    calls = [b["id"] for b in assistant["content"] if b["type"] == "tool_call"]
    answered = {m["tool_call_id"] for m in messages[last + 1 :] if m["role"] == "tool_result"}
    missing = tuple(c for c in calls if c not in answered)
    if missing:
        done = tuple(c for c in calls if c in answered)
        return Verdict("crashed", 3, "batch partly answered" if done else "no result yet", missing, done)
    if calls:
        return Verdict("crashed", 2, "next model call unfinished")
    assert assistant["stop_reason"] == "stop", assistant
    if runs.get(assistant["run_id"]) is False:
        return Verdict("crashed", 1, "final reply, run not completed")
    return Verdict("completed")


def assert_paired(messages: list[Any], where: str) -> None:
    """Every tool call has exactly one result after it, before the next assistant or user message."""
    open_calls: dict[str, int] = {}
    for i, m in enumerate(messages):
        role = m.role if not isinstance(m, dict) else m["role"]
        if role in ("assistant", "user"):
            unanswered = [c for c, n in open_calls.items() if n == 0]
            assert not unanswered, f"{where}: message {i} ({role}) follows tool calls without results: {unanswered}"
            open_calls = {}
            if role == "assistant":
                content = m.content if not isinstance(m, dict) else m["content"]
                for b in content:
                    block_type = b["type"] if isinstance(b, dict) else b.type
                    if block_type == "tool_call":
                        open_calls[b["id"] if isinstance(b, dict) else b.id] = 0
        elif role == "tool_result":
            call_id = m.tool_call_id if not isinstance(m, dict) else m["tool_call_id"]
            assert call_id in open_calls, (
                f"{where}: result {i} answers {call_id}, not a call of the last assistant message"
            )
            open_calls[call_id] += 1
            assert open_calls[call_id] == 1, f"{where}: tool call {call_id} has two results"
    unanswered = [c for c, n in open_calls.items() if n == 0]
    assert not unanswered, f"{where}: ends with tool calls without results: {unanswered}"


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Lane:
    n: int
    rng: random.Random
    location: str
    """Where the lane's store is (see :mod:`tests.helpers.store_locations`); two lanes share each."""
    ledger: Path
    store: Checkpointer
    """The store the resumers of this process use."""
    reader: Checkpointer
    """Another connection to the same store, for the checks only."""
    dir: Path


@dataclass
class Run:
    server: ForkServer
    target: int
    """How many SIGKILLs to make."""
    kills: int = 0
    openings: list[float] = field(default_factory=list)
    """Seconds from a child's spawn to its store being open, per child that got that far."""
    points: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    settled: Counter[str] = field(default_factory=Counter)
    episodes: int = 0
    body_reruns: int = 0
    effect_attempts: int = 0
    """Attempts of idempotent effects (every one, no dedup) in the checked threads."""
    repeated_keys: int = 0
    """(thread, job key) pairs whose effect was attempted more than once."""
    repeats_by_point: Counter[str] = field(default_factory=Counter)
    """Repeated effect attempts, by the crash point the kill of the earlier attempt's process left."""
    killed: dict[str, float] = field(default_factory=dict)
    """Process label -> unix time by which it was SIGKILLed and reaped."""
    kill_points: dict[tuple[str, str], str] = field(default_factory=dict)
    """(process label, thread) -> the crash point (Verdict.key) its kill left the thread in."""
    attempts_checked: dict[tuple[Path, str], int] = field(default_factory=dict)
    """(ledger, thread) -> effect attempts counted when the thread was checked."""
    success_keys: dict[Path, set[tuple[str, str]]] = field(default_factory=dict)
    final_rows: dict[tuple[str, str], Rows] = field(default_factory=dict)
    """(store location, thread) -> the rows when the thread was checked complete."""


async def kill_once(
    run: Run,
    lane: Lane,
    mode: str,
    episode: int,
    threads: dict[str, dict[str, Any]],
    before: dict[str, Rows],
    delay: float,
) -> dict[str, tuple[Verdict, Rows]]:
    """Fork a child running ``mode`` on ``threads``, SIGKILL it after ``delay`` s, check a. and b."""
    notes, log = lane.dir / f"e{episode}-{mode}.jsonl", lane.dir / f"e{episode}-{mode}.log"
    process = f"child e{episode}-{mode} of lane {lane.n}"
    request = {
        "mode": mode,
        "store": lane.location,
        "ledger": str(lane.ledger),
        "notes": str(notes),
        "log": str(log),
        "process": process,
        "threads": [{"thread": t, "scenario": s} for t, s in threads.items()],
    }
    spawned = time.time()
    pid = await run.server.spawn(request)
    # Kill delays count from the moment the store is open: opening costs a connect on a
    # server store and nothing on SQLite, and the delays are drawn for the scenario alone.
    await asyncio.sleep(delay + _opening(run))
    died = await run.server.kill(pid)
    run.killed[process] = time.time()  # reaped: nothing it does can come later than this
    await settle(lane.location)  # but a server may still run the statement it sent last
    lines = [json.loads(x) for x in notes.read_text().splitlines()] if notes.exists() else []
    run.openings.extend(x["opened"] - spawned for x in lines if "opened" in x)
    errors = [x["error"] for x in lines if "error" in x]
    assert not errors, f"child of episode {episode} failed:\n{errors[0]}"
    assert died["signal"] == signal.SIGKILL, (died, log.read_text() if log.exists() else "")
    finished = [x["finished"] for x in lines if "finished" in x]
    assert all(o == "completed" for f in finished for o in f), finished
    run.kills += 1
    run.kinds[f"{mode}, {len(threads)} thread(s) in one process"] += 1
    if finished:
        run.kinds["landed after the run ended"] += 1

    verdicts = {}
    for thread_id in threads:
        seen = [x["json"] for x in lines if x.get("seen") == thread_id]
        verdicts[thread_id] = await check_after_kill(run, lane, thread_id, before[thread_id], seen)
        run.kill_points[(process, thread_id)] = verdicts[thread_id][0].key
    return verdicts


async def check_after_kill(run: Run, lane: Lane, thread_id: str, before: Rows, seen: list[str]) -> tuple[Verdict, Rows]:
    rows, runs = await stored_rows(lane.reader, thread_id)
    # a. nothing persisted earlier changed; what the child saw persisted is there, in order
    assert rows[: len(before)] == before, f"{thread_id}: rows persisted before the child started changed"
    new = rows[len(before) :]
    assert len(seen) <= len(new) <= len(seen) + 1, (thread_id, len(seen), len(new))
    assert [text for _, text in new[: len(seen)]] == seen, f"{thread_id}: persisted messages lost or reordered"

    # b. the diagnosis names the crash point the rows imply
    expected = expected_verdict(rows, runs)
    data = await lane.store.load(thread_id)
    assert data is None or not data.problems
    verdict = diagnose(data.messages, data.runs, data.journal) if data is not None else diagnose([])
    want_state = {"empty": ThreadState.EMPTY, "completed": ThreadState.COMPLETED}.get(
        expected.state, ThreadState.CRASHED
    )
    assert verdict.state is want_state, (thread_id, expected, verdict)
    assert verdict.crash_point == (CrashPoint(expected.point) if expected.point else None), (
        thread_id,
        expected,
        verdict,
    )
    assert tuple(d.call.id for d in verdict.dangling) == expected.missing
    assert tuple(verdict.answered) == expected.answered
    for dangling in verdict.dangling:
        body_started = ledger_rows(
            lane.ledger,
            "SELECT COUNT(*) FROM attempts WHERE thread_id = ? AND tool_call_id = ? AND phase = 'start'",
            thread_id,
            dangling.call.id,
        )[0][0]
        assert dangling.journaled
        if body_started:
            assert dangling.started_at is not None, (
                f"{thread_id}: {dangling.call.id} ran but its start was not journaled"
            )
    run.points[expected.key] += 1
    return expected, rows


async def resume_and_check(run: Run, lane: Lane, thread_id: str, scenario: dict[str, Any], expected: Verdict) -> None:
    """c., d., e.: resume in this process and check the whole thread and the ledger."""
    before, _ = await stored_rows(lane.reader, thread_id)
    attempts_before = tool_rows(lane.ledger, thread_id)
    agent = make_agent(
        lane.store,
        thread_id,
        scenario,
        str(lane.ledger),
        speed=RESUME_SPEED,
        delay=0.0,
        record=True,
        process=f"resumer of {thread_id} in the test process",
    )
    plan = await agent.plan_resume()
    tools = agent._config.tools_by_name
    for call in plan.calls:
        tool = tools[call.call.name]
        if tool.idempotent:
            job = await lane.store.job_get(thread_id, call_job_key(tool, call.call))
            want = "reuse" if job is not None and job.status == "done" else "rerun"
        else:
            want = "interrupt"
        assert call.action == want, (thread_id, call)
    assert [c.call.id for c in plan.calls] == list(expected.missing)

    if expected.state in ("empty", "completed"):
        with pytest.raises(NothingToResumeError):
            await agent.resume()
        outcome = await agent.prompt(prompt_text(thread_id)) if expected.state == "empty" else "completed"
    else:
        outcome = await agent.resume()
    assert outcome == "completed", (thread_id, agent.state.error)

    # c. the run completed and nothing earlier changed
    rows, runs = await stored_rows(lane.reader, thread_id)
    assert rows[: len(before)] == before, f"{thread_id}: resume changed rows persisted before it"
    assert expected_verdict(rows, runs).state == "completed"
    data = await lane.store.load(thread_id)
    assert data is not None and not data.problems
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED
    messages = data.messages
    final = messages[-1]
    assert isinstance(final, AssistantMessage) and final.stop_reason == "stop" and final.text == scenario["final"]
    replies = [m for m in messages if isinstance(m, AssistantMessage)]
    assert [m.text for m in replies] == [t["text"] for t in scenario["turns"]] + [scenario["final"]], thread_id

    # e. no call without its result, in the thread and in every request the model got
    assert_paired(messages, f"{thread_id} (final thread)")
    for i, request in enumerate(agent.provider.requests):
        assert_paired(list(request.messages), f"{thread_id} (request {i} of the resumer)")

    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolResultMessage)}
    for call in plan.calls:
        result = results[call.call.id]
        settled = result.metadata.get("settled")
        want = {"reuse": "reused", "rerun": "rerun", "interrupt": "interrupted"}[call.action]
        assert settled == want, (thread_id, call.call.id, result.metadata)
        run.settled[want] += 1
        if call.action == "interrupt":
            assert result.is_error and "interrupted" in result.text
        if call.action != "rerun":  # neither reused nor interrupted work runs again (body or effect)
            assert tool_rows(lane.ledger, thread_id)[call.call.id] == attempts_before[call.call.id], call

    # d. what the job store promises for idempotent effects, checked on every attempt
    calls = {c.id: c for m in replies for c in m.tool_calls}
    success_keys: set[str] = set()
    for call_id, result in results.items():
        call = calls[call_id]
        tool = tools[call.name]
        if tool.idempotent:
            assert not result.is_error, (thread_id, call_id, result.text)
            key = call_job_key(tool, call)
            assert key is not None
            success_keys.add(key)
        elif not result.is_error:
            done = ledger_rows(
                lane.ledger,
                "SELECT COUNT(*) FROM attempts WHERE thread_id = ? AND tool_call_id = ? AND phase = 'done'",
                thread_id,
                call_id,
            )[0][0]
            assert done == 1, (thread_id, call_id)
    tries: dict[str, list[tuple[str, float]]] = {}
    for key, process, at in ledger_rows(
        lane.ledger, "SELECT job_key, process, at FROM effect_attempts WHERE thread_id = ? ORDER BY seq", thread_id
    ):
        tries.setdefault(key, []).append((process, at))
    assert set(tries) == success_keys, (thread_id, set(tries) ^ success_keys)
    starts = Counter(
        k
        for (k,) in ledger_rows(
            lane.ledger,
            "SELECT job_key FROM attempts WHERE thread_id = ? AND phase = 'start' AND job_key IS NOT NULL",
            thread_id,
        )
    )
    for key in success_keys:
        job = await lane.store.job_get(thread_id, key)
        assert job is not None and job.status == "done" and job.finished_at is not None, (thread_id, key, job)
        done_at = job.finished_at  # a done job is never begun or finished again: this is when it became done
        history = f"{thread_id} {key}: attempts {tries[key]}, job done at {done_at}"
        *earlier, (last, _) = tries[key]
        # Never an attempt after the job was recorded done (reuse must answer instead).
        assert all(at < done_at for _, at in tries[key]), f"an effect attempt after its job was done: {history}"
        # The last attempt is the one the done record is for: its process lived until then.
        assert run.killed.get(last, float("inf")) > done_at, (
            f"the job became done after its last attempter died: {history}"
        )
        # Any earlier attempt lies in the crash window: its process (each a different one)
        # was killed while the job was still started, i.e. before it became done.
        assert len({process for process, _ in tries[key]}) == len(tries[key]), f"one process attempted twice: {history}"
        for process, _ in earlier:
            killed_at = run.killed.get(process)
            assert killed_at is not None, f"attempted again although {process} was never killed: {history}"
            assert killed_at < done_at, (
                f"attempted again although {process} was killed after the job was done: {history}"
            )
            run.repeats_by_point[run.kill_points[(process, thread_id)]] += 1
        assert job.attempts >= starts[key] >= len(tries[key]), (history, job, starts[key])
        run.body_reruns += starts[key] - 1
        run.repeated_keys += bool(earlier)
        run.effect_attempts += len(tries[key])
    run.attempts_checked[(lane.ledger, thread_id)] = sum(map(len, tries.values()))
    # The external system's own record: one effect per key, by its primary key (a count of
    # what the outside world keeps, which holds by construction: not a check of the job store).
    effects = {k for (k,) in ledger_rows(lane.ledger, "SELECT job_key FROM effects WHERE thread_id = ?", thread_id)}
    assert effects == success_keys, (thread_id, effects ^ success_keys)
    run.success_keys.setdefault(lane.ledger, set()).update((thread_id, k) for k in success_keys)
    once = ledger_rows(
        lane.ledger,
        "SELECT tool_call_id, COUNT(*) FROM attempts WHERE thread_id = ? AND job_key IS NULL AND phase = 'start'"
        " GROUP BY tool_call_id HAVING COUNT(*) > 1",
        thread_id,
    )
    assert not once, f"{thread_id}: a tool that is not idempotent ran twice: {once}"
    run.final_rows[(lane.location, thread_id)] = rows


def _opening(run: Run) -> float:
    return statistics.median(run.openings[-50:]) if run.openings else 0.0


def by_point(run: Run) -> dict[int, int]:
    """Threads found at each crash point (1, 2, 3) after a kill, so far."""
    return {p: sum(n for k, n in run.points.items() if k.startswith(f"point {p}")) for p in (1, 2, 3)}


def covered(run: Run) -> bool:
    """Whether the kills so far reached every crash point and kind of kill often enough to
    count (the test's last assertions); until then lanes go on past ``target`` kills, up to
    the time limit, since where kills land depends on the store's speed and the load."""
    return (
        all(n >= MIN_PER_POINT for n in by_point(run).values())
        and run.kinds["prompt, 2 thread(s) in one process"] >= 5
        and run.kinds["resume, 1 thread(s) in one process"] >= 5
    )


async def run_lane(run: Run, lane: Lane, deadline: float) -> None:
    while (run.kills < run.target or not covered(run)) and time.monotonic() < deadline:
        run.episodes += 1
        episode = run.episodes
        rng = lane.rng
        tags = ("a", "b") if rng.random() < 0.2 else ("a",)
        threads = {f"L{lane.n}-e{episode}-{t}": make_scenario(rng, f"{lane.n}.{episode}{t}") for t in tags}
        before: dict[str, Rows] = {t: [] for t in threads}
        longest = max(estimate_seconds(s) for s in threads.values())
        verdicts = await kill_once(run, lane, "prompt", episode, threads, before, rng.uniform(0.003, longest * 1.05))
        if len(threads) == 1 and rng.random() < 0.3:
            ((thread_id, (verdict, rows)),) = verdicts.items()
            if verdict.state == "crashed":
                # Kill the resumer too: a crash during settlement or a later turn.
                verdicts = await kill_once(
                    run, lane, "resume", episode, threads, {thread_id: rows}, rng.uniform(0.003, longest * 0.7)
                )
        await asyncio.gather(*(resume_and_check(run, lane, t, threads[t], verdicts[t][0]) for t in threads))


async def test_random_sigkills_recover_every_crash_point(
    tmp_path: Path, store_backend: str, make_location: Callable[[str], Awaitable[str]]
) -> None:
    started = time.monotonic()
    kills = KILLS[store_backend]
    REPORT.append(
        f"crash injection on {store_backend}: seed {SEED} (set CUBEPI_CRASH_SEED={SEED} to repeat the same "
        "scenarios and kill delays)"
    )
    server = await ForkServer.start(tmp_path / "forkserver.err")
    run = Run(server, kills)
    readers: dict[str, Checkpointer] = {}
    lanes: list[Lane] = []
    async with AsyncExitStack() as stores:
        stores.push_async_callback(server.close)
        for n in range(LANES):
            if n % 2 == 0:  # two lanes (two concurrent children) share each store
                location, ledger = await make_location(f"agents{n // 2}"), tmp_path / f"ledger{n // 2}.sqlite"
                create_ledger(ledger)
                store = await open_location(location, create=True)
                stores.push_async_callback(store.close)
                readers[location] = await open_location(location, create=False)
                stores.push_async_callback(readers[location].close)
            lane_dir = tmp_path / f"lane{n}"
            lane_dir.mkdir()
            lanes.append(Lane(n, random.Random(f"{SEED}-{n}"), location, ledger, store, readers[location], lane_dir))
        await asyncio.gather(*(run_lane(run, lane, started + 140) for lane in lanes))

        # Threads finished earlier were never touched by the children and resumers that followed.
        for (location, thread_id), rows in run.final_rows.items():
            assert (await stored_rows(readers[location], thread_id))[0] == rows, thread_id
        # Across the whole run: effects only under (thread, job key) pairs whose result says
        # success, and no effect attempted on a thread after it was checked.
        effect_rows = 0
        for ledger, keys in run.success_keys.items():
            effects = ledger_rows(ledger, "SELECT thread_id, job_key FROM effects")
            assert set(effects) == keys
            effect_rows += len(effects)
            attempted = dict(ledger_rows(ledger, "SELECT thread_id, COUNT(*) FROM effect_attempts GROUP BY thread_id"))
            assert attempted == {t: n for (lg, t), n in run.attempts_checked.items() if lg == ledger and n}

    elapsed = time.monotonic() - started
    points = by_point(run)
    REPORT.append(
        f"  {run.kills} SIGKILLs in {run.episodes} episodes, {LANES} concurrent children on 2 {store_backend} stores, "
        f"{elapsed:.1f} s"
    )
    REPORT.append(
        "  threads found per crash point after a kill: "
        + ", ".join(f"{p} ({CrashPoint(p).words}) {points[p]}" for p in (1, 2, 3))
    )
    for key, n in sorted(run.points.items()):
        REPORT.append(f"    {key}: {n}")
    for key, n in sorted(run.kinds.items()):
        REPORT.append(f"  kills of {key}: {n}")
    pairs = sum(map(len, run.success_keys.values()))
    repeats = sum(run.repeats_by_point.values())
    REPORT.append(f"  dangling calls settled: {dict(run.settled)}")
    REPORT.append(
        f"  idempotent effects: {run.effect_attempts} attempts (every one recorded) for {pairs} successful "
        f"(thread, job key) pairs; {run.repeated_keys} pairs attempted more than once ({repeats} repeats), every "
        f"repeat after the earlier attempt's process was killed while the job was started, none after a job was "
        f"done; bodies re-run {run.body_reruns} times"
    )
    REPORT.append(
        "  repeated effect attempts by the crash point the interrupting kill left: "
        + (", ".join(f"{key}: {n}" for key, n in sorted(run.repeats_by_point.items())) or "none")
    )
    REPORT.append(
        f"  the external ledger, deduplicating on the job key, keeps {effect_rows} effects for those {pairs} pairs "
        f"(one per key by its primary key; {repeats} repeated attempts absorbed there)"
    )
    assert run.kills >= kills, f"only {run.kills} kills before the time limit"
    assert all(n >= MIN_PER_POINT for n in points.values()), points
    assert run.kinds["prompt, 2 thread(s) in one process"] >= 5
    assert run.kinds["resume, 1 thread(s) in one process"] >= 5
    assert run.settled["rerun"] and run.settled["interrupted"] and run.settled["reused"]
    assert repeats > 0, "no kill fell between an effect and its job's done record: the crash window was never exercised"
