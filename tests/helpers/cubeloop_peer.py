"""The real cubeloop (0.15.3) as the other program: load a thread in its SQLiteCheckpointer,
check it with its own tool-cycle checker, continue it with its own Agent and FauxProvider.

Everything here runs cubeloop's code in this process (its aiosqlite store on the same file);
open no store of ours on the file at the same time.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from cubeloop import Agent
from cubeloop.agent._tool_cycle import check_tool_cycle
from cubeloop.checkpointer import SQLiteCheckpointer
from cubeloop.checkpointer.base import CheckpointData
from cubeloop.providers import FauxProvider
from cubeloop.providers.faux import faux_assistant_message

CONTINUED = "Continued by cubeloop."


async def cubeloop_load(db: Path, thread_id: str) -> CheckpointData:
    """The thread as cubeloop's ``SQLiteCheckpointer.load`` returns it; raises
    ``AssertionError`` when cubeloop finds no such thread, and cubeloop's
    ``CheckpointCorruptionError`` when it cannot read a row."""
    async with SQLiteCheckpointer(str(db)) as store:
        data = await store.load(thread_id)
    assert data is not None, f"cubeloop finds no thread {thread_id!r} in {db}"
    return data


def check_cycles(messages: list[Any]) -> None:
    """cubeloop's ``check_tool_cycle`` over the whole history, then over each run's messages
    (grouped by ``run_id``, in order), as cubeloop checks a run before completing it and a
    fork copies completed runs. Raises cubeloop's ``ToolCycleViolation``."""
    check_tool_cycle(messages)
    runs: dict[str | None, list[Any]] = {}
    for m in messages:
        runs.setdefault(m.run_id, []).append(m)
    for group in runs.values():
        check_tool_cycle(group)


async def cubeloop_continue(db: Path, thread_id: str, text: str = "One more thing, please.") -> str:
    """Send ``text`` on the thread with cubeloop's Agent (FauxProvider answering
    :data:`CONTINUED`); return the run id. cubeloop marks the run complete only when its
    messages pass the tool-cycle check (see :func:`run_completed`)."""
    provider = FauxProvider(provider_id="faux")
    provider.set_responses([faux_assistant_message(CONTINUED)])
    async with SQLiteCheckpointer(str(db)) as store:
        agent = Agent(model=provider.model("faux-1"), checkpointer=store, thread_id=thread_id)
        return await agent.prompt(text)


def run_completed(db: Path, thread_id: str, run_id: str) -> bool:
    """Whether ``runs`` marks the run completed, read with plain ``sqlite3``."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = c.execute(
            "SELECT completed_at FROM runs WHERE thread_id = ? AND run_id = ?", (thread_id, run_id)
        ).fetchone()
    finally:
        c.close()
    return row is not None and row[0] is not None


async def cubeloop_fork(db: Path, source: str, new_thread: str, *, after_run_id: str) -> None:
    """cubeloop's ``fork``: copy ``source``'s messages of runs completed up to ``after_run_id``."""
    provider = FauxProvider(provider_id="faux")
    async with SQLiteCheckpointer(str(db)) as store:
        agent = Agent(model=provider.model("faux-1"), checkpointer=store, thread_id=new_thread)
        await agent.fork(source, new_thread, after_run_id=after_run_id)
