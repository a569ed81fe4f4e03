"""Threads written by the real cubeloop (0.15.3), one child process per thread.

Each thread is written by ``tests/helpers/cubeloop_child.py`` - cubeloop's own ``Agent``,
``FauxProvider`` and ``SQLiteCheckpointer`` - and the child is either SIGKILLed at a known
moment (it prints ``MARK <name>`` on stdout and waits there; the parent kills it once the
marks it waits for have arrived) or ends by itself (exit 0).

:func:`make_crashpoint_db` writes the crash-point database the tests open, resume and show:
the threads of :data:`CRASHPOINT_THREADS`, in that order, into one file, and returns its
description (per thread: roles, unanswered tool call ids, runs, crash point, how it was
produced) in the shape of the database's JSON description. Expected facts (roles, which
calls are unanswered, the crash point) are written here, by hand, from how each thread is
produced; made facts (row ids, run ids) are read back from the file with plain ``sqlite3``.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.children import ChildFailed, run_marked
from tests.helpers.cubeloop_child import FILE_TEXT, FINAL, PIXEL_PNG

CHILD = Path(__file__).with_name("cubeloop_child.py")
CUBELOOP_VERSION = "0.15.3"
CUBELOOP_TABLES = ("messages", "runs", "thread_extra", "thread_pending_request", "thread_hitl_answers")
"""The tables cubeloop's SQLiteCheckpointer creates."""

DEFAULT_CLOCK = 1_795_954_400.0
"""The cubeloop children's frozen wall clock unless told otherwise (unix seconds)."""

__all__ = [
    "CRASHPOINT_THREADS",
    "DEFAULT_CLOCK",
    "FILE_TEXT",
    "FINAL",
    "PIXEL_PNG",
    "ChildFailed",
    "CubeloopThread",
    "make_crashpoint_db",
    "read_rows",
    "run_cubeloop",
]


def run_cubeloop(
    db: Path,
    scenario: str,
    thread_id: str,
    *,
    kill_at: Sequence[str] = (),
    clock: float = DEFAULT_CLOCK,
    arg: str = "",
) -> list[str]:
    """Run one cubeloop child writing ``thread_id`` into ``db``; return the marks it printed.

    ``clock`` is the child's (frozen) wall clock in unix seconds, ``arg`` the scenario's
    extra input; ``kill_at`` as for :func:`~tests.helpers.children.run_marked` (SIGKILL once
    every mark named was printed; without, the child must exit 0 after ``MARK done``).
    Raises :class:`~tests.helpers.children.ChildFailed` when the child ends otherwise.
    """
    argv = [sys.executable, str(CHILD), str(db), scenario, thread_id, repr(clock), arg]
    return run_marked(argv, f"cubeloop child {scenario!r}", kill_at=kill_at)


@dataclass(frozen=True)
class CubeloopThread:
    """How one crash-point thread is produced and what it must then hold."""

    thread_id: str
    scenario: str
    kill_at: tuple[str, ...]
    crash_point: str
    roles: tuple[str, ...]
    unanswered_tool_call_ids: tuple[str, ...]
    tool_calls_in_last_assistant: tuple[str, ...]
    run_completed: bool
    thread_extra_row: bool
    how_produced: str
    clock: float

    def expected(self) -> dict[str, Any]:
        """The facts fixed by how the thread is produced, keyed as in the description."""
        return {
            "thread_id": self.thread_id,
            "roles": list(self.roles),
            "last_role": self.roles[-1],
            "unanswered_tool_call_ids": list(self.unanswered_tool_call_ids),
            "tool_calls_in_last_assistant": list(self.tool_calls_in_last_assistant),
            "run_completed": self.run_completed,
            "thread_extra_row": self.thread_extra_row,
            "crash_point": self.crash_point,
            "how_produced": self.how_produced,
            "process_end": self.process_end,
        }

    @property
    def process_end(self) -> str:
        """How the child ended, in words."""
        if not self.kill_at:
            return "exit 0"
        return f"SIGKILL (returncode -9) after marker {' and '.join(repr(m) for m in self.kill_at)}"


_USER, _ASSISTANT, _RESULT = "user", "assistant", "tool_result"

CRASHPOINT_THREADS: tuple[CubeloopThread, ...] = (
    CubeloopThread(
        "crash-after-user",
        "crash_after_user",
        ("model_thinking",),
        "after_user_before_assistant",
        (_USER,),
        (),
        (),
        False,
        False,
        "FauxProvider step is an async factory that drops a marker and sleeps before streaming; "
        "child SIGKILLed while the first model call is in flight.",
        1_795_954_405.39,
    ),
    CubeloopThread(
        "crash-after-tool-result",
        "crash_after_tool_result",
        ("model_thinking",),
        "after_tool_result_before_next_assistant",
        (_USER, _ASSISTANT, _RESULT),
        (),
        ("call_read_1",),
        False,
        True,
        "turn 1: tool call to fast read_file (result persisted); turn 2: faux factory sleeps; "
        "SIGKILL during the second model call.",
        1_795_954_405.76,
    ),
    CubeloopThread(
        "crash-mid-tool",
        "crash_mid_tool",
        ("tool_started:slow_step",),
        "mid_tool_dangling_tool_call",
        (_USER, _ASSISTANT),
        ("call_slow_1",),
        ("call_slow_1",),
        False,
        False,
        "assistant calls slow_step, which drops a marker and sleeps; SIGKILL during the sleep, "
        "so the tool_call has no tool_result.",
        1_795_954_406.13,
    ),
    CubeloopThread(
        "completed",
        "completed",
        (),
        "none_completed",
        (_USER, _ASSISTANT, _RESULT, _ASSISTANT),
        (),
        (),
        True,
        True,
        "tool call to read_file, then final text answer; normal exit.",
        1_795_954_406.50,
    ),
    CubeloopThread(
        "aborted",
        "aborted",
        (),
        "aborted_by_host",
        (_USER, _ASSISTANT, _RESULT, _ASSISTANT),
        (),
        (),
        False,
        True,
        "assistant calls wait_for_abort (waits on the tool's signal); the child calls agent.abort() "
        "once the tool has started; prompt() returns; normal exit.",
        1_795_954_406.70,
    ),
    CubeloopThread(
        "multi-tool-partial",
        "batch_sequential",
        ("tool_started:slow_step",),
        "mid_tool_batch_partial_results",
        (_USER, _ASSISTANT, _RESULT),
        ("call_slow_2",),
        ("call_read_1", "call_slow_2"),
        False,
        False,
        "Agent(tool_execution='sequential'); one assistant message with two tool calls (read_file fast, "
        "then slow_step); read_file's result is persisted as soon as it finishes; SIGKILL during slow_step.",
        1_795_954_406.94,
    ),
    CubeloopThread(
        "multi-tool-parallel-mid-batch",
        "batch_parallel",
        ("tool_done:read_file:src/app.py", "tool_started:slow_step"),
        "mid_tool_dangling_tool_call",
        (_USER, _ASSISTANT),
        ("call_read_1", "call_slow_2"),
        ("call_read_1", "call_slow_2"),
        False,
        False,
        "default tool_execution='parallel'; two tool calls (read_file fast, slow_step sleeps); read_file "
        "FINISHED but parallel mode persists results only after the whole batch settles, so SIGKILL "
        "during slow_step leaves both calls unanswered.",
        1_795_954_407.31,
    ),
    CubeloopThread(
        "multi-tool-partial-parallel-injected",
        "batch_parallel_listener_blocked",
        ("listener_blocked",),
        "mid_tool_batch_partial_results",
        (_USER, _ASSISTANT, _RESULT),
        ("call_read_2",),
        ("call_read_1", "call_read_2"),
        False,
        False,
        "default parallel mode, two fast tools; a subscribed listener blocks on the message_end of the "
        "FIRST tool_result (listeners run after the checkpoint append), then SIGKILL.",
        1_795_954_407.97,
    ),
)
"""The crash-point threads, in the order they are written (so message row ids are 1, 2, ...)."""


def make_crashpoint_db(db: Path) -> dict[str, Any]:
    """Write every thread of :data:`CRASHPOINT_THREADS` into the new file ``db`` (one child
    each, in order) and return the description: ``{"cubeloop_version", "journal_mode",
    "threads": [...]}``, each thread with ``thread_id``, ``roles``, ``message_row_ids``,
    ``last_role``, ``unanswered_tool_call_ids``, ``tool_calls_in_last_assistant``, ``runs``
    (``run_id``, ``completed``, ``completion_seq``), ``run_completed``,
    ``thread_extra_row``, ``crash_point``, ``how_produced`` and ``process_end``.

    Raises :class:`ChildFailed` when a child does not end as its thread says, and
    ``FileExistsError`` when ``db`` exists.
    """
    if db.exists():
        raise FileExistsError(f"{db} exists; the crash-point database is written into a new file.")
    for t in CRASHPOINT_THREADS:
        run_cubeloop(db, t.scenario, t.thread_id, kill_at=t.kill_at, clock=t.clock)
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        journal_mode = c.execute("PRAGMA journal_mode").fetchone()[0]
        threads = []
        for t in CRASHPOINT_THREADS:
            row_ids = [
                r[0] for r in c.execute("SELECT id FROM messages WHERE thread_id = ? ORDER BY id", (t.thread_id,))
            ]
            runs = [
                {"run_id": run_id, "completed": completed is not None, "completion_seq": seq}
                for run_id, completed, seq in c.execute(
                    "SELECT run_id, completed_at, completion_seq FROM runs WHERE thread_id = ? ORDER BY rowid",
                    (t.thread_id,),
                )
            ]
            threads.append({**t.expected(), "message_row_ids": row_ids, "runs": runs})
    finally:
        c.close()
    return {"cubeloop_version": CUBELOOP_VERSION, "journal_mode": journal_mode, "threads": threads}


def read_rows(db: Path, thread_id: str) -> list[dict[str, Any]]:
    """The thread's stored messages as JSON objects, in row order, read with plain ``sqlite3``."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = c.execute("SELECT message_json FROM messages WHERE thread_id = ? ORDER BY id", (thread_id,)).fetchall()
    finally:
        c.close()
    return [json.loads(r[0]) for r in rows]
