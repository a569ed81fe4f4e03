"""The stepped tool of the stepped-tool crash test, shared by its children and the test.

``assemble(tag, steps, ms)`` is an idempotent tool of ``steps`` steps (:mod:`core.steps`):
step ``k`` (1-based) makes one external effect and appends :func:`step_value` to the data
the previous step committed, so the final data of an uninterrupted run is
:func:`expected_data`. Each effect goes to a *ledger*, a SQLite file outside the agent's
store, the way ``tests/crash/scenario.py`` keeps one: in one transaction,

* ``step_attempts`` gets a row for every attempt, never deduplicated (job key, step, the
  attempting process's label, ``at`` unix seconds just before the effect);
* ``step_effects`` is the external system's own record, ``INSERT OR IGNORE`` under
  ``(job key, step)``: the idempotency key a step passes on (``ctx.job_key`` and its step
  number), as :mod:`core.steps` tells tool authors to do.

Half of a step's sleep comes before its effect and half after, so a kill lands before an
effect, between an effect and its commit, or after the commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from core.agent import Agent
from core.checkpoint.base import Checkpointer
from core.messages import AssistantMessage
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.steps import run_steps
from core.tools import AgentTool, ToolContext, tool

WORKFLOW = "assemble/1"
FINAL = "Assembled: every step is in the ledger once."
CALL_ID = "call_assemble"

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS step_attempts (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, job_key TEXT NOT NULL, step INTEGER NOT NULL,
  process TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS step_effects (
  job_key TEXT NOT NULL, step INTEGER NOT NULL, value TEXT NOT NULL, process TEXT NOT NULL,
  PRIMARY KEY (job_key, step));
"""


def create_ledger(path: str) -> None:
    """Create the ledger file (WAL, so a killed writer never leaves it locked)."""
    c = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=WAL")
        c.executescript(LEDGER_SCHEMA)
    finally:
        c.close()


def ledger_rows(path: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    c = sqlite3.connect(path, timeout=30)
    try:
        return c.execute(sql, params).fetchall()
    finally:
        c.close()


def step_value(tag: str, step: int) -> str:
    """What step ``step`` of the call tagged ``tag`` adds to the data (deterministic)."""
    return hashlib.sha256(f"{tag}/{step}".encode()).hexdigest()[:12]


def expected_data(tag: str, steps: int) -> list[str]:
    """The final data of an uninterrupted run."""
    return [step_value(tag, k) for k in range(1, steps + 1)]


def result_text(data: list[str]) -> str:
    return "assembled " + ",".join(data)


def _effect(ledger: str, key: str, step: int, value: str, process: str) -> None:
    c = sqlite3.connect(ledger, timeout=30, isolation_level=None)
    try:
        c.execute("BEGIN IMMEDIATE")
        c.execute(
            "INSERT INTO step_attempts (job_key, step, process, pid, at) VALUES (?, ?, ?, ?, ?)",
            (key, step, process, os.getpid(), time.time()),
        )
        c.execute(
            "INSERT OR IGNORE INTO step_effects (job_key, step, value, process) VALUES (?, ?, ?, ?)",
            (key, step, value, process),
        )
        c.execute("COMMIT")
    finally:
        c.close()


def build_tool(ledger: str, process: str, speed: float = 1.0) -> AgentTool:
    """The ``assemble`` tool, its effects labelled ``process``; ``speed`` scales its sleeps."""

    @tool(idempotent=True)
    async def assemble(tag: str, steps: int, ms: int, ctx: ToolContext) -> str:
        """Assemble something in steps, one external effect per step."""
        assert ctx.job_key is not None and ctx.steps is not None, "a stepped tool on our store gets its step log"
        key = ctx.job_key
        print("MARK tool", flush=True)  # the parent learns how long a run takes to reach its tool

        def step(k: int) -> Callable[[list[str]], Any]:
            async def run(done: list[str]) -> list[str]:
                assert len(done) == k - 1, (k, done)  # step k always continues from step k - 1's data
                await asyncio.sleep(ms * speed / 2000)
                value = step_value(tag, k)
                await asyncio.to_thread(_effect, ledger, key, k, value, process)
                await asyncio.sleep(ms * speed / 2000)
                return [*done, value]

            return run

        data = await run_steps(ctx.steps, [step(k) for k in range(1, steps + 1)], workflow=WORKFLOW, initial=[])
        return result_text(data)

    return assemble


def make_agent(
    store: Checkpointer, thread_id: str, args: dict[str, Any], ledger: str, process: str, speed: float = 1.0
) -> Agent:
    """The agent of one thread: the model calls ``assemble(**args)`` once, then ends."""

    def reply(request: ModelRequest) -> AssistantMessage:
        if any(isinstance(m, AssistantMessage) for m in request.messages):
            return faux_reply(FINAL)
        return faux_reply("Assembling now.", faux_tool_call("assemble", args, id=CALL_ID))

    provider = FauxProvider(fallback=reply, delay=0.0, record=False)
    return Agent(provider, store, thread_id, tools=[build_tool(ledger, process, speed)])


def prompt_text(thread_id: str) -> str:
    return f"Assemble {thread_id}, one step at a time."
