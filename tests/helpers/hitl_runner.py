"""The parent's side of ``tests.helpers.hitl_child``: start one child, read its marks, count
the runs of its tool (the effects file). Used by the core tests across processes and by the
app's tests that follow such a child."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from core.checkpoint.base import CheckpointData
from core.messages import AssistantMessage, ToolResultMessage
from tests.helpers.children import CHILD_TIMEOUT, REPO_ROOT, signal_unreaped
from tests.helpers.hitl_child import CALL_ID

THREAD = "hitl-1"
"""The thread every child of one test runs (they share it: runner, resumer, answerers)."""


class Child:
    """One ``tests.helpers.hitl_child`` process and the marks it printed."""

    def __init__(self, proc: asyncio.subprocess.Process, what: str) -> None:
        self.proc = proc
        self.what = what
        self.marks: list[str] = []

    @classmethod
    async def start(cls, location: str, scenario: str, effects: Path, arg: str = "") -> Child:
        """Start ``python -m tests.helpers.hitl_child LOCATION SCENARIO THREAD EFFECTS ARG``
        (see that module for the scenarios) from the repository root."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.helpers.hitl_child",
            location,
            scenario,
            THREAD,
            str(effects),
            arg,
            cwd=REPO_ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        return cls(proc, f"{scenario} {arg}".strip())

    async def until(self, name: str) -> None:
        """Read marks until ``name`` was printed (fails on an early exit or after CHILD_TIMEOUT)."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(CHILD_TIMEOUT):
            while name not in self.marks:
                line = await self.proc.stdout.readline()
                if not line:
                    err = await self.proc.stderr.read() if self.proc.stderr else b""
                    pytest.fail(f"child {self.what} ended before {name!r} (marks {self.marks}): {err.decode()[-2000:]}")
                text = line.decode()
                if text.startswith("MARK "):
                    self.marks.append(text[5:].strip())

    async def finish(self) -> list[str]:
        """Wait for a clean exit (``MARK done``, status 0); the marks printed."""
        await self.until("done")
        async with asyncio.timeout(CHILD_TIMEOUT):
            code = await self.proc.wait()
        assert code == 0, f"child {self.what} exited {code}"
        return self.marks

    async def kill(self) -> None:
        """SIGKILL the child and check it died of that signal."""
        signal_unreaped(self.proc, signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL

    async def stop(self) -> None:
        """Kill the child if it still runs (a test that failed midway leaves none behind)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def body_runs(effects: Path) -> list[str]:
    """One line per run of the child's tool body (``delete_file PATH pid=PID``), across processes."""
    return effects.read_text().splitlines() if effects.exists() else []


def last_reply(data: CheckpointData) -> str:
    """The text of the thread's last assistant message (the child's model says ``saw: <result>``)."""
    reply = [m for m in data.messages if isinstance(m, AssistantMessage)][-1]
    return "".join(b.text for b in reply.content if b.type == "text")


def result_of(data: CheckpointData) -> ToolResultMessage:
    """The one tool result of the asking call (``CALL_ID``); fails when there is none or several."""
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage) and m.tool_call_id == CALL_ID]
    return result
