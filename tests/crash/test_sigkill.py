"""A real crash: an agent in a child process is killed with SIGKILL while its tool runs.

Runs on every store backend (``store_backend``, see ``tests/crash/conftest.py``): the
child gets the store's location string and opens it itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from core.agent import Agent
from core.errors import FingerprintMismatchError
from core.messages import AssistantMessage, ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_text
from core.recovery import CrashPoint, ResumeAction, ThreadState, diagnose
from tests.helpers.store_locations import open_location

ROOT = Path(__file__).resolve().parents[2]


def _kill_during_tool(location: str, thread_id: str, marker: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.child_slow_tool", location, thread_id, str(marker)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None, f"child exited early: {child.stdout.read().decode() if child.stdout else ''}"
            assert time.monotonic() < deadline, "the child's tool never started"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


async def test_sigkill_mid_tool_is_diagnosed_and_resumed(
    tmp_path: Path, make_location: Callable[[str], Awaitable[str]]
) -> None:
    location, marker = await make_location("agent"), tmp_path / "tool-started"
    _kill_during_tool(location, "t-crash", marker)

    store = await open_location(location, create=False)
    try:
        data = await store.load("t-crash")
        assert data is not None and not data.problems
        assert [m.role for m in data.messages] == ["user", "assistant"]
        verdict = diagnose(data.messages, data.runs)
        assert verdict.state is ThreadState.CRASHED
        assert verdict.crash_point is CrashPoint.MID_TOOL
        assert [d.call.id for d in verdict.dangling] == ["call_slow_1"] == [marker.read_text()]
        assert verdict.action is ResumeAction.SETTLE_THEN_CALL_MODEL
        assert not any(r.completed for r in data.runs)

        # Resume in this process, by an agent without the child's tool: that is another
        # definition of the agent, refused (nothing runs) until the change is accepted.
        provider = FauxProvider([faux_reply(faux_text("The build was interrupted; please check it."))])
        resumer = Agent(provider, store, "t-crash")
        with pytest.raises(FingerprintMismatchError) as refused:
            await resumer.resume()
        assert refused.value.changes == ("tool slow_step: removed",) and provider.requests == []
        # Accepted: the dangling call is settled before the model is called.
        outcome = await resumer.resume(accept_changes=True)
        assert outcome == "completed"
        after = await store.load("t-crash")
        assert after is not None
        assert [m.role for m in after.messages] == ["user", "assistant", "tool_result", "assistant"]
        settled = after.messages[2]
        assert isinstance(settled, ToolResultMessage) and settled.is_error
        assert settled.tool_call_id == "call_slow_1" and "interrupted" in settled.text
        assert isinstance(after.messages[3], AssistantMessage) and after.messages[3].stop_reason == "stop"
        assert diagnose(after.messages, after.runs).state is ThreadState.COMPLETED
        # The provider saw the call together with its result, never a bare call.
        sent = provider.requests[0].messages
        assert any(isinstance(m, ToolResultMessage) and m.tool_call_id == "call_slow_1" for m in sent)
    finally:
        await store.close()
