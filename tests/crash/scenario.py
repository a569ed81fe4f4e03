"""What the crash-injection children run, shared with the test that checks them.

A *scenario* is a JSON object (so it crosses the pipe to a child unchanged)::

    {"turns": [{"text": "...", "calls": [{"name": "fetch_page", "args": {...}}, ...]}, ...],
     "final": "...", "mode": "parallel" | "sequential", "steer": bool, "delay": 0.004}

The faux model answers a request by counting the assistant messages already in it: turn
``k`` replies with ``turns[k]`` (tool calls ``call_t<k>_<i>``), after the last turn with
``final``. So a resumer given the same scenario continues exactly where a killed child
stopped, whatever was persisted.

Tools and their side effects live in a *ledger*: a separate SQLite file, outside the
agent's store (whatever its backend). ``attempts`` gets a row each time a tool body starts
(phase ``start``) and each time a non-idempotent one finishes (``done``). Each time an idempotent tool makes its
effect, one transaction writes two rows:

* ``effect_attempts``: every attempt, never deduplicated, with the thread, job key, call,
  the process that made it (``pid`` and ``process``, a label unique per child or
  resumer, as pids may be reused) and ``at`` (unix seconds, just before the effect);
* ``effects``: the external system's own record, ``INSERT OR IGNORE`` under
  ``(thread_id, ctx.job_key)`` - the idempotency key it dedups on, as ``core.jobs`` tells
  tool authors to do. It holds one row per key *by construction*; it shows what the
  outside world keeps, not how often the work was tried.

What ``core.jobs`` promises is checked on ``effect_attempts`` against the job records
(see ``tests/crash/test_crash_injection.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.agent import Agent
from core.checkpoint import codec
from core.checkpoint.base import Checkpointer
from core.events import MessageEnd, ToolExecutionEnd
from core.jobs import idempotent
from core.messages import AssistantMessage
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.tools import AgentTool, ToolContext, tool
from tests.helpers.store_locations import open_location

IDEMPOTENT_TOOLS = frozenset({"fetch_page", "charge"})
OTHER_TOOLS = frozenset({"slow_step", "write_note"})

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
  thread_id TEXT NOT NULL, job_key TEXT NOT NULL, tool_call_id TEXT NOT NULL, pid INTEGER NOT NULL,
  PRIMARY KEY (thread_id, job_key));
CREATE TABLE IF NOT EXISTS effect_attempts (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, tool TEXT NOT NULL, job_key TEXT NOT NULL,
  tool_call_id TEXT NOT NULL, pid INTEGER NOT NULL, process TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS effect_attempts_by_key ON effect_attempts (thread_id, job_key);
CREATE TABLE IF NOT EXISTS attempts (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, tool TEXT NOT NULL,
  tool_call_id TEXT NOT NULL, job_key TEXT, phase TEXT NOT NULL, pid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS attempts_by_thread ON attempts (thread_id, tool_call_id);
"""


def create_ledger(path: Path) -> None:
    """Create the ledger file (WAL, so killed writers never leave it locked)."""
    c = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        c.execute("PRAGMA journal_mode=WAL")
        c.executescript(LEDGER_SCHEMA)
    finally:
        c.close()


def _ledger_write(path: str, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    c = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        c.execute("BEGIN IMMEDIATE")
        for sql, params in statements:
            c.execute(sql, params)
        c.execute("COMMIT")
    finally:
        c.close()


def build_tools(thread_id: str, ledger: str, speed: float = 1.0, process: str = "") -> list[AgentTool]:
    """The four tools of one thread; ``speed`` scales their sleeps (resumers run faster);
    ``process`` labels this process's effect attempts (default: its pid)."""
    pid = os.getpid()
    process = process or f"pid {pid}"

    async def attempt(name: str, ctx: ToolContext, phase: str) -> None:
        sql = "INSERT INTO attempts (thread_id, tool, tool_call_id, job_key, phase, pid) VALUES (?, ?, ?, ?, ?, ?)"
        await asyncio.to_thread(
            _ledger_write, ledger, [(sql, (thread_id, name, ctx.tool_call_id, ctx.job_key, phase, pid))]
        )

    async def effect(name: str, ctx: ToolContext) -> None:
        assert ctx.job_key, "an idempotent tool always gets its job key"
        await asyncio.to_thread(
            _ledger_write,
            ledger,
            [
                (
                    "INSERT INTO effect_attempts (thread_id, tool, job_key, tool_call_id, pid, process, at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (thread_id, name, ctx.job_key, ctx.tool_call_id, pid, process, time.time()),
                ),
                (
                    "INSERT OR IGNORE INTO effects (thread_id, job_key, tool_call_id, pid) VALUES (?, ?, ?, ?)",
                    (thread_id, ctx.job_key, ctx.tool_call_id, pid),
                ),
            ],
        )

    async def nap(ms: int) -> None:
        await asyncio.sleep(ms * speed / 1000)

    @tool(idempotent=True)
    async def fetch_page(url: str, ms: int, ctx: ToolContext) -> str:
        """Fetch a page and file it (an external effect keyed by the job key)."""
        await attempt("fetch_page", ctx, "start")
        await nap(ms // 2)
        await effect("fetch_page", ctx)
        await nap(ms - ms // 2)
        return f"fetched {url}"

    @tool(name="charge")
    async def charge_card(order: str, cents: int, ms: int, ctx: ToolContext) -> str:
        """Charge an order once (idempotency key: the order)."""
        await attempt("charge", ctx, "start")
        await nap(ms // 3)
        await effect("charge", ctx)
        await nap(ms - ms // 3)
        return f"charged {cents} for {order}"

    @tool
    async def slow_step(label: str, ms: int, ctx: ToolContext) -> str:
        """A step that is not safe to repeat."""
        await attempt("slow_step", ctx, "start")
        await nap(ms)
        await attempt("slow_step", ctx, "done")
        return f"{label} done"

    @tool
    async def write_note(text: str, ms: int, ctx: ToolContext) -> str:
        """Append a note somewhere (not safe to repeat)."""
        await attempt("write_note", ctx, "start")
        await nap(ms)
        await attempt("write_note", ctx, "done")
        return f"noted {len(text)} chars"

    return [fetch_page, idempotent(charge_card, key=lambda args: args["order"]), slow_step, write_note]


# --- scenarios -------------------------------------------------------------------------------


def make_scenario(rng: random.Random, tag: str) -> dict[str, Any]:
    """A random multi-turn scenario; ``tag`` makes its arguments unique (one job key per call)."""
    turns: list[dict[str, Any]] = []
    earlier: list[dict[str, Any]] = []
    for t in range(rng.randint(2, 3)):
        calls = []
        for i in range(rng.choice((1, 2, 2, 3))):
            name = rng.choice(("fetch_page", "fetch_page", "charge", "slow_step", "write_note"))
            ms = rng.randint(10, 80)
            args: dict[str, Any] = {
                "fetch_page": {"url": f"https://example.test/{tag}/{t}/{i}", "ms": ms},
                "charge": {"order": f"{tag}-o{t}{i}", "cents": rng.randint(100, 9999), "ms": ms},
                "slow_step": {"label": f"step {t}.{i}", "ms": ms},
                "write_note": {"text": f"note {t}.{i} of {tag}", "ms": ms},
            }[name]
            calls.append({"name": name, "args": args})
        if t > 0 and earlier and rng.random() < 0.35:
            # The same idempotent call again: its done job answers without running it.
            calls.append(dict(rng.choice(earlier)))
        earlier += [c for c in calls if c["name"] in IDEMPOTENT_TOOLS]
        turns.append({"text": f"Turn {t}: working on {len(calls)} thing(s) now.", "calls": calls})
    return {
        "turns": turns,
        "final": "All done: every step finished and the ledger is up to date.",
        "mode": rng.choice(("parallel", "sequential")),
        "steer": rng.random() < 0.3,
        "delay": 0.004,
        # A listener slow on the final reply (as a UI may be) widens the window between
        # the reply's append and the run's completion: crash point 1 with a final reply.
        "linger": rng.choice((0.0, 0.0, 0.03)),
    }


def estimate_seconds(scenario: dict[str, Any], *, delay: float | None = None, speed: float = 1.0) -> float:
    """Roughly how long a child takes to run the scenario from its start (for kill timing)."""
    per_delta = (scenario["delay"] if delay is None else delay) + 0.0006
    total = 0.015

    def deltas(text: str, calls: list[dict[str, Any]]) -> int:
        n = -(-len(text) // 8)
        for c in calls:
            n += 1 + -(-len(json.dumps(c["args"])) // 8)
        return n

    for turn in scenario["turns"]:
        total += deltas(turn["text"], turn["calls"]) * per_delta + 0.004
        times = [c["args"]["ms"] * speed / 1000 + 0.003 for c in turn["calls"]]
        total += max(times) if scenario["mode"] == "parallel" else sum(times)
    total += deltas(scenario["final"], []) * per_delta + 0.004 + scenario["linger"]
    return total


def replier(scenario: dict[str, Any]) -> Callable[[ModelRequest], AssistantMessage]:
    """The faux model of ``scenario`` (see the module docstring)."""
    turns = scenario["turns"]

    def reply(request: ModelRequest) -> AssistantMessage:
        turn = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
        if turn >= len(turns):
            return faux_reply(scenario["final"])
        spec = turns[turn]
        calls = [faux_tool_call(c["name"], c["args"], id=f"call_t{turn}_{i}") for i, c in enumerate(spec["calls"])]
        return faux_reply(spec["text"], *calls)

    return reply


def prompt_text(thread_id: str) -> str:
    return f"Scenario {thread_id}: run every step and keep the ledger exact."


def make_agent(
    store: Checkpointer,
    thread_id: str,
    scenario: dict[str, Any],
    ledger: str,
    *,
    speed: float = 1.0,
    delay: float | None = None,
    record: bool = False,
    process: str = "",
) -> Agent:
    provider = FauxProvider(
        fallback=replier(scenario), delay=scenario["delay"] if delay is None else delay, record=record
    )
    return Agent(
        provider,
        store,
        thread_id,
        tools=build_tools(thread_id, ledger, speed, process),
        tool_execution=scenario["mode"],
    )


# --- the child -------------------------------------------------------------------------------


async def child_main(req: dict[str, Any]) -> None:
    """Run ``req["mode"]`` ("prompt" or "resume") on every thread of ``req["threads"]`` at once,
    on the store at location ``req["store"]`` (see :mod:`tests.helpers.store_locations`).

    Each message the agent persisted is reported to the notes file (one JSON line, one
    ``write`` system call, after ``message_end``: the agent calls listeners only after the
    message was appended). Nothing here ever exits on its own: the parent kills it.
    """
    fd = os.open(req["notes"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(obj: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(obj) + "\n").encode())

    store = await open_location(req["store"], create=False)
    note({"opened": time.time()})  # the parent times kills from here: opening a server store takes a while
    runs = []
    for job in req["threads"]:
        thread_id, scenario = job["thread"], job["scenario"]
        agent = make_agent(store, thread_id, scenario, req["ledger"], process=req["process"])

        async def seen(event: Any, thread_id: str = thread_id, linger: float = scenario["linger"]) -> None:
            if isinstance(event, MessageEnd):
                note({"seen": thread_id, "json": codec.encode(event.message)})
                message = event.message
                if linger and isinstance(message, AssistantMessage) and message.stop_reason == "stop":
                    await asyncio.sleep(linger)

        agent.subscribe(seen)
        if scenario["steer"] and req["mode"] == "prompt":
            steered: list[bool] = []

            def steer(event: Any, agent: Agent = agent, steered: list[bool] = steered) -> None:
                if isinstance(event, ToolExecutionEnd) and not steered:
                    steered.append(True)
                    agent.steer("Also keep the notes short, please.")

            agent.subscribe(steer)
        runs.append(agent.prompt(prompt_text(thread_id)) if req["mode"] == "prompt" else agent.resume())
    outcomes = await asyncio.gather(*runs, return_exceptions=True)
    note({"finished": [o if isinstance(o, str) else repr(o) for o in outcomes]})
