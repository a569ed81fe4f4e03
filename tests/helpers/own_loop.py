"""Run a coroutine in an event loop of its own, for tests of what escapes a task.

asyncio re-raises ``SystemExit`` and ``KeyboardInterrupt`` out of a task through the event
loop itself, not into whoever awaits the task: in pytest's loop one would end the whole
test session. Run here, it ends only this loop and fails the one test. The loop runs in a
thread of its own, so what such an exit leaves behind (CPython 3.11 then once corrupted
pytest's reporting in the main thread) stays in that thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def run_in_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` in another thread; a ``SystemExit`` or ``KeyboardInterrupt``
    that ended the loop fails the test in one sentence."""
    with ThreadPoolExecutor(1, thread_name_prefix="own-loop") as pool:
        try:
            return pool.submit(asyncio.run, coro).result()
        except (SystemExit, KeyboardInterrupt) as exc:
            escaped = f"{type(exc).__name__}({exc}) escaped a task and ended the event loop"
    # Failed outside the handler, so the failure does not chain the exit's traceback.
    pytest.fail(escaped, pytrace=False)
