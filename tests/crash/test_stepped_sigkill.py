"""Random SIGKILLs of real children running a stepped tool: every step takes effect once, and
the final data equals an uninterrupted run's.

Each thread's agent calls ``assemble`` (:mod:`tests.crash.stepped`): an idempotent tool of
4-8 steps that commits after each step (:mod:`core.steps`) and makes one external effect
per step in a ledger outside the store. A child process (a fresh interpreter, so nothing
is shared with this one) runs the thread - its first prompt, or a resume of what an
earlier child left - and is SIGKILLed after a random delay, 1 to 4 times per thread; then
this process resumes the thread to completion. Run on every store backend
(``store_backend``, see ``tests/crash/conftest.py``). After each thread:

a. the thread is completed, its tool result and the step record's data equal what an
   uninterrupted run gives (:func:`tests.crash.stepped.expected_data`), and the record's
   revision equals the number of steps: each step was committed exactly once;
b. in effect each step ran once: the ledger, deduplicating on (job key, step) as the
   external system would, holds each step once with its value;
c. what the step store promises, checked on every attempt (``step_attempts``, never
   deduplicated): no step ran again after a kill that left it committed (read from the
   store once the killed child was reaped); a step attempted more than once was attempted
   by distinct processes, each but the last one killed while that step was not committed
   yet (the window between a step's effect and its commit); and a resume after a kill
   that left ``k`` steps committed ran none of the first ``k``.

Across the run the test requires kills that fell inside a step's window (a repeated
attempt) and resumes that continued from a committed step (not from step 1).

Seed: ``CUBEPI_CRASH_SEED`` (printed, shared with the other crash tests); kills:
``CUBEPI_STEP_KILLS`` on SQLite (default 40), ``CUBEPI_STEP_KILLS_NETWORK`` on Postgres and
Redis (default 20).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.checkpoint.base import Checkpointer
from core.jobs import job_key
from core.messages import ToolResultMessage
from core.recovery import ThreadState, diagnose
from tests.crash.stepped import (
    create_ledger,
    expected_data,
    ledger_rows,
    make_agent,
    prompt_text,
    result_text,
)
from tests.helpers.children import signal_unreaped
from tests.helpers.crash_report import REPORT
from tests.helpers.store_backends import settle
from tests.helpers.store_locations import open_location

ROOT = Path(__file__).resolve().parents[2]
KILLS = {
    "sqlite": int(os.environ.get("CUBEPI_STEP_KILLS") or 40),
    "postgres": int(os.environ.get("CUBEPI_STEP_KILLS_NETWORK") or 20),
    "redis": int(os.environ.get("CUBEPI_STEP_KILLS_NETWORK") or 20),
}
SEED = int(os.environ.get("CUBEPI_CRASH_SEED") or random.SystemRandom().randrange(2**32))
LANES = 2
OPEN_TIMEOUT = 60.0
"""Seconds a child may take to open its store (a liveness bound, not a speed check)."""
FINAL_SPEED = 0.2
"""The resumer in this process sleeps this fraction of each step's time."""


@dataclass
class Run:
    target: int
    kills: int = 0
    finished_early: int = 0
    """Children whose run ended before their kill came."""
    killed: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Process label -> (unix time it was reaped, steps committed then)."""
    repeated_steps: int = 0
    continued: int = 0
    """Resumes (children or this process) that began with some, not all, steps committed."""
    threads: int = 0
    steps: int = 0
    reaching: list[float] = field(default_factory=list)
    """Seconds from a child's store being open to its tool's start, per child that got there."""

    def to_tool(self) -> float:
        """How long a run takes to reach its tool, lately (a round trip per write on a server
        store, next to nothing on SQLite), so kill delays cover the steps on every backend."""
        return statistics.median(self.reaching[-20:]) if self.reaching else 0.05


async def committed_steps(reader: Checkpointer, thread_id: str, key: str) -> int:
    record = await reader.step_get(thread_id, key)  # type: ignore[attr-defined]
    return record.next_step if record is not None else 0


async def next_mode(reader: Checkpointer, thread_id: str) -> str | None:
    """``"prompt"`` for a thread with nothing stored, ``"resume"`` for one with work left, ``None`` when done."""
    data = await reader.load(thread_id)
    if data is None or not data.messages:
        return "prompt"
    return "resume" if diagnose(data.messages, data.runs, data.journal).resumable else None


async def run_child(run: Run, request: dict[str, Any], delay: float, log: Path) -> tuple[bool, float]:
    """Run a child on ``request``; SIGKILL it ``delay`` s after its store is open. Returns
    (killed, unix time by which it was reaped); notes in ``run.reaching`` how long the
    child took from its store being open to its tool's start, when it got that far."""
    with log.open("ab") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.crash.child_stepped_tool",
            json.dumps(request),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), OPEN_TIMEOUT)
        assert line.startswith(b"MARK opened"), (
            f"{request['process']} did not open its store: {line!r} {log.read_text()}"
        )
        opened = time.monotonic()
        lines: list[str] = []

        async def read() -> None:
            assert child.stdout is not None
            while line := await child.stdout.readline():
                lines.append(line.decode())
                if line.startswith(b"MARK tool"):
                    run.reaching.append(time.monotonic() - opened)

        reader = asyncio.create_task(read())
        try:
            await asyncio.wait_for(child.wait(), delay)
        except TimeoutError:
            # The child may end on its own between the timeout and the signal; its return
            # code then tells what happened.
            signal_unreaped(child, signal.SIGKILL)
        await child.wait()
        await asyncio.wait_for(reader, OPEN_TIMEOUT)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    reaped = time.time()
    rest = "".join(lines)
    if child.returncode == -signal.SIGKILL:
        return True, reaped
    assert child.returncode == 0 and "MARK done completed" in rest, (
        request["process"],
        child.returncode,
        rest,
        log.read_text(),
    )
    return False, reaped


async def run_thread(
    run: Run,
    rng: random.Random,
    location: str,
    store: Checkpointer,
    reader: Checkpointer,
    ledger: str,
    name: str,
    tmp: Path,
) -> None:
    steps, ms = rng.randint(4, 8), rng.randint(20, 60)
    args = {"tag": name, "steps": steps, "ms": ms}
    key = job_key("assemble", args)
    tool_time = steps * ms / 1000
    for n in range(rng.randint(1, 4)):
        mode = await next_mode(reader, name)
        if mode is None:
            break
        before = await committed_steps(reader, name, key)
        process = f"child {n} of {name}"
        request = {"store": location, "thread": name, "ledger": ledger, "process": process, "mode": mode, "args": args}
        # From the store's opening: before the tool (lease, fingerprints, the first writes), in a step, or after.
        delay = rng.uniform(0.0, (run.to_tool() + tool_time) * 1.1)
        killed, reaped = await run_child(run, request, delay, tmp / f"{name}-{n}.log")
        await settle(location)  # a server may still run the statement the child sent last
        committed = await committed_steps(reader, name, key)
        run.continued += mode == "resume" and 0 < before < steps
        if killed:
            run.kills += 1
            run.killed[process] = (reaped, committed)
        else:
            run.finished_early += 1
        assert not ledger_rows(
            ledger,
            "SELECT step FROM step_attempts WHERE job_key = ? AND process = ? AND step <= ?",
            key,
            process,
            before,
        ), f"{process} ran a step that was committed before it started ({before} of {steps})"

    # Finish the thread here.
    before = await committed_steps(reader, name, key)
    mode = await next_mode(reader, name)
    final = f"final resumer of {name}"
    agent = make_agent(store, name, args, ledger, final, speed=FINAL_SPEED)
    if mode is not None:
        outcome = await (agent.prompt(prompt_text(name)) if mode == "prompt" else agent.resume())
        assert outcome == "completed", (name, agent.state.error)
        run.continued += mode == "resume" and 0 < before < steps
        assert not ledger_rows(
            ledger, "SELECT step FROM step_attempts WHERE job_key = ? AND process = ? AND step <= ?", key, final, before
        ), f"the final resume ran a step that was committed before it started ({before} of {steps})"

    # a. completed; the data and the result are an uninterrupted run's; each step committed once
    data = await reader.load(name)
    assert data is not None and not data.problems
    assert diagnose(data.messages, data.runs, data.journal).state is ThreadState.COMPLETED, name
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    want = expected_data(name, steps)
    assert not result.is_error and result.text == result_text(want), (name, result.text)
    record = await reader.step_get(name, key)  # type: ignore[attr-defined]
    assert record is not None
    assert (record.next_step, record.total_steps, record.revision, record.data) == (steps, steps, steps, want), record

    # b. in effect each step ran once, with its value
    effects = ledger_rows(ledger, "SELECT step, value FROM step_effects WHERE job_key = ? ORDER BY step", key)
    assert effects == list(enumerate(want, start=1)), (name, effects)

    # c. every attempt, against the kills and what they left committed
    attempts: dict[int, list[tuple[str, float]]] = {}
    for step, process, at in ledger_rows(
        ledger, "SELECT step, process, at FROM step_attempts WHERE job_key = ? ORDER BY seq", key
    ):
        attempts.setdefault(step, []).append((process, at))
    assert sorted(attempts) == list(range(1, steps + 1)), (name, sorted(attempts))
    mine = {p: v for p, v in run.killed.items() if p.endswith(f" of {name}")}
    for step, tries in attempts.items():
        history = f"{name} step {step}: attempts {tries}, kills {mine}"
        assert len({p for p, _ in tries}) == len(tries), f"one process attempted a step twice: {history}"
        for reaped, committed in mine.values():
            if committed >= step:
                assert all(at < reaped for _, at in tries), f"a step ran again after it was committed: {history}"
        for process, _ in tries[:-1]:
            assert process in mine, f"attempted again although {process} was never killed: {history}"
            assert mine[process][1] < step, f"attempted again although {process} died with it committed: {history}"
        run.repeated_steps += len(tries) - 1
    run.threads += 1
    run.steps += steps


async def run_lane(
    run: Run, lane: int, location: str, store: Checkpointer, reader: Checkpointer, ledger: str, tmp: Path
) -> None:
    rng = random.Random(f"{SEED}-steps-{lane}")
    n = 0
    deadline = time.monotonic() + 150
    while run.kills < run.target and time.monotonic() < deadline:
        n += 1
        await run_thread(run, rng, location, store, reader, ledger, f"S{lane}-{n}", tmp)


async def test_random_sigkills_during_a_stepped_tool_take_each_step_once(
    tmp_path: Path, store_backend: str, make_location: Callable[[str], Awaitable[str]]
) -> None:
    started = time.monotonic()
    REPORT.append(
        f"stepped-tool crash test on {store_backend}: seed {SEED} (set CUBEPI_CRASH_SEED={SEED} to repeat the same "
        "threads and kill delays)"
    )
    run = Run(KILLS[store_backend])
    location = await make_location("steps")
    ledger = str(tmp_path / "steps-ledger.sqlite")
    create_ledger(ledger)
    store = await open_location(location, create=True)
    reader = await open_location(location, create=False)
    try:
        await asyncio.gather(*(run_lane(run, lane, location, store, reader, ledger, tmp_path) for lane in range(LANES)))
    finally:
        await reader.close()
        await store.close()
    REPORT.append(
        f"  {run.kills} SIGKILLs of children running a stepped tool ({run.finished_early} more ended before their "
        f"kill), {run.threads} threads, {run.steps} steps, {time.monotonic() - started:.1f} s; {run.repeated_steps} "
        f"step attempts repeated after a kill inside a step's window, {run.continued} resumes continued from a "
        "committed step; every step in the ledger once, every final data an uninterrupted run's"
    )
    assert run.kills >= run.target, f"only {run.kills} kills before the time limit"
    assert run.repeated_steps > 0, "no kill fell between a step's effect and its commit: the window was never exercised"
    assert run.continued > 0, "no resume continued from a committed step"
