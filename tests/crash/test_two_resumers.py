"""Two processes resume the same crashed thread at the same instant: exactly one runs it.

Two long-lived worker processes (:mod:`tests.crash.resume_worker`) take 50 trials over
their pipes. Each trial writes a crashed thread straight into the store (a user message,
an assistant message whose tool calls lack some or all results, its run claimed and never
completed, sometimes an expired lease or a lease of a dead process), lets both workers
prepare an agent, then releases both at once by closing the only writer of a FIFO both
wait on. Exactly one must complete the resume; the other must be refused with
``RunAlreadyClaimedError`` ("already running"). The thread must end with one settlement
per dangling call, one final reply, the lease released, and each tool body run at most
once (by the winner).

Runs on every store backend (``store_backend``, see ``tests/crash/conftest.py``): the
workers get the store's location string and open it themselves.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from core.checkpoint.base import Checkpointer, Lease
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.recovery import CrashPoint, ThreadState, diagnose
from tests.crash.resume_worker import FINAL
from tests.helpers.crash_report import REPORT
from tests.helpers.store_locations import open_location

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 50

# Per trial: which calls the crashed assistant message made, and which have results.
SHAPES: list[tuple[list[tuple[str, dict[str, Any]]], set[int]]] = [
    ([("fetch", {"url": "https://example.test/a"})], set()),
    ([("deploy", {"target": "staging"})], set()),
    ([("fetch", {"url": "https://example.test/b"}), ("deploy", {"target": "prod"})], {0}),
    ([("fetch", {"url": "https://example.test/c"}), ("deploy", {"target": "qa"})], set()),
    ([("deploy", {"target": "edge"}), ("fetch", {"url": "https://example.test/d"})], {0}),
]
LEASES = ("none", "expired", "dead pid")


class Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, stderr: Path) -> Worker:
        with stderr.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.crash.resume_worker",
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        worker = cls(proc)
        assert "ready" in await worker.read(), stderr.read_text()
        return worker

    async def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        await self.proc.stdin.drain()

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        assert line, "a worker died"
        return json.loads(line)

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 30)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


async def write_crashed_thread(
    store: Checkpointer, thread_id: str, trial: int, gone: int
) -> tuple[list[str], set[str]]:
    """A run that died mid-tool; returns the call ids and the ids of calls without results."""
    calls_spec, answered = SHAPES[trial % len(SHAPES)]
    run_id = uuid.uuid4().hex
    await store.claim_run(thread_id, run_id)
    await store.append(thread_id, [user_text(f"Trial {trial}: fetch and deploy.", run_id=run_id)])
    calls = [ToolCall(id=f"call_{trial}_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls_spec)]
    await store.append(
        thread_id,
        [AssistantMessage(content=[TextContent(text="Working on it."), *calls], stop_reason="tool_use", run_id=run_id)],
    )
    for i, call in enumerate(calls):
        await store.record_tool_event(thread_id, call.id, "start", tool_name=call.name, run_id=run_id)
        if i in answered:
            await store.record_tool_event(thread_id, call.id, "end", run_id=run_id)
            result = ToolResultMessage(
                tool_call_id=call.id, tool_name=call.name, content=[TextContent(text="ok")], run_id=run_id
            )
            await store.append(thread_id, [result])
    now = time.time()
    kind = LEASES[trial % len(LEASES)]
    if kind != "none":
        # The crashed run's lease: expired, or still "valid" but held by a process that is gone.
        expires = now - 5 if kind == "expired" else now + 600
        lease = Lease(thread_id, uuid.uuid4().hex, gone, socket.gethostname(), run_id, now - 30, now - 20, expires)
        await store.acquire_lease(lease, is_stale=lambda _current: True)
    return [c.id for c in calls], {c.id for i, c in enumerate(calls) if i not in answered}


async def test_two_resumers_at_once_exactly_one_runs(
    tmp_path: Path, store_backend: str, make_location: Callable[[str], Awaitable[str]]
) -> None:
    started = time.monotonic()
    location, runs_log = await make_location("agents"), tmp_path / "tool-runs.txt"
    store = await open_location(location, create=True)
    workers = await asyncio.gather(*(Worker.start(tmp_path / f"worker{i}.err") for i in range(2)))
    gone = dead_pid()
    winners: Counter[int] = Counter()
    try:
        for trial in range(TRIALS):
            thread_id = f"trial-{trial}"
            _call_ids, dangling = await write_crashed_thread(store, thread_id, trial, gone)
            before = await store.load(thread_id)
            assert before is not None
            verdict = diagnose(before.messages, before.runs, before.journal)
            assert verdict.crash_point is CrashPoint.MID_TOOL and {d.call.id for d in verdict.dangling} == dangling

            go = tmp_path / f"go-{trial}"
            os.mkfifo(go)
            writer = os.open(go, os.O_RDWR | os.O_NONBLOCK)  # the only writer: closing it is the signal
            try:
                request = {"trial": trial, "store": location, "thread": thread_id, "go": str(go), "runs": str(runs_log)}
                await asyncio.gather(*(w.send(request) for w in workers))
                assert [await w.read() for w in workers] == [{"prepared": trial}] * 2
            finally:
                os.close(writer)
            answers = await asyncio.gather(*(w.read() for w in workers))
            os.unlink(go)

            won = [i for i, a in enumerate(answers) if a["outcome"] == "completed" and a["error"] is None]
            assert len(won) == 1, (trial, answers)
            loser = answers[1 - won[0]]
            assert loser["error"] == "RunAlreadyClaimedError" and "already running" in loser["message"], (
                trial,
                answers,
            )
            winners[won[0]] += 1

            data = await store.load(thread_id)
            assert data is not None and not data.problems
            messages = data.messages
            assert [m.model_dump_json() for m in messages[: len(before.messages)]] == [
                m.model_dump_json() for m in before.messages
            ]
            new = messages[len(before.messages) :]
            settled = [m for m in new if isinstance(m, ToolResultMessage)]
            assert sorted(m.tool_call_id for m in settled) == sorted(dangling), (trial, settled)
            for m in settled:
                want = "rerun" if m.tool_name == "fetch" else "interrupted"
                assert m.metadata.get("settled") == want and m.is_error == (want == "interrupted"), m
            replies = [m for m in new if isinstance(m, AssistantMessage)]
            assert len(replies) == 1 and replies[0] is new[-1] and replies[0].stop_reason == "stop"
            assert replies[0].text == FINAL
            assert len(new) == len(dangling) + 1
            assert diagnose(messages, data.runs, data.journal).state is ThreadState.COMPLETED
            # One new run, by the winner; it closed the crashed run whose calls it settled
            # first (cubeloop's fork keeps completed runs only).
            assert len(data.runs) == 2 and all(r.completed for r in data.runs), data.runs
            assert data.runs[0].completion_seq < data.runs[1].completion_seq, data.runs  # type: ignore[operator]
            assert await store.get_lease(thread_id) is None

            # Only the winner ran tool bodies: the idempotent dangling call once, nothing else.
            ran = [line.split() for line in runs_log.read_text().splitlines()] if runs_log.exists() else []
            ran = [r for r in ran if r[0] == str(trial)]
            expected = sorted(c for c in dangling if c in {m.tool_call_id for m in settled if m.tool_name == "fetch"})
            assert sorted(r[3] for r in ran) == expected, (trial, ran)
            assert len({r[1] for r in ran}) <= 1
    finally:
        await asyncio.gather(*(w.close() for w in workers))
        await store.close()
    REPORT.append(
        f"two resumers on {store_backend}: {TRIALS} trials, exactly one resumed each time (worker 0 won {winners[0]}, "
        f"worker 1 won {winners[1]}), the other refused as already running; {time.monotonic() - started:.1f} s"
    )
