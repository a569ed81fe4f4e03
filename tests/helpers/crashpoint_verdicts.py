"""What this project's diagnosis says for each crash point of the cubeloop crash-point threads."""

from __future__ import annotations

from typing import Any

from core.recovery import CrashPoint, ThreadState
from tests.helpers.cubeloop_threads import CRASHPOINT_THREADS

EXPECTED: dict[str, tuple[ThreadState, CrashPoint | None]] = {
    "after_user_before_assistant": (ThreadState.CRASHED, CrashPoint.BETWEEN_TURNS),
    "after_tool_result_before_next_assistant": (ThreadState.CRASHED, CrashPoint.AFTER_TOOL_RESULT),
    "mid_tool_dangling_tool_call": (ThreadState.CRASHED, CrashPoint.MID_TOOL),
    "mid_tool_batch_partial_results": (ThreadState.CRASHED, CrashPoint.MID_TOOL),
    "none_completed": (ThreadState.COMPLETED, None),
    "aborted_by_host": (ThreadState.ABORTED, None),
}
"""crash_point of a thread -> (state, crash point) of its diagnosis: the mapping table of
the crash-point database (point 1 between turns, 2 after tool result, 3 mid-tool, also for
a parallel batch partly answered; completed; aborted)."""

THREADS: list[dict[str, Any]] = [t.expected() for t in CRASHPOINT_THREADS]
"""Each crash-point thread's expected facts (no row or run ids: those are in ``fixture_json``)."""
