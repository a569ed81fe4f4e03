"""An agent whose model call waits to be retried once, for runners in a child process.

    python -m core.runner run --db DB --thread T --agent tests.helpers.retrying_agent:make_agent PROMPT

Gates are files in ``CUBEPI_TEST_GATES``. Each model call's first attempt lasts until
:data:`FAILED` exists (so a test can look before and after); it then announces
``RetryWait(WAIT_SECONDS, "rate limited", 1, 5)``, as the Anthropic provider does after a
429, and waits: until ``WAIT_SECONDS`` have passed, :data:`DONE` exists (so a test need
not sit the whole wait out once it has seen it), or the run is aborted. Then it streams
:data:`REPLY`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from core.events import RetryWait, StreamEnd, StreamEvent, TextDelta
from core.messages import AssistantMessage, TextContent
from core.providers.base import ABORTED_TEXT, ModelRequest, error_reply
from core.runner import AgentSpec

WAIT_SECONDS = 60.0
"""The announced wait, in seconds: far longer than a follower on a loaded machine takes to show it."""

FAILED = "rate-limited"
"""The gate file that ends the first attempt, with a rate limit."""

DONE = "retry-done"
"""The gate file that ends the wait early."""

REPLY = "Sales rose by 4 % after the wait."
"""The text of every reply, streamed in 4-character deltas after the wait."""


class RetryingProvider:
    """Announces one retry wait per model call, waits it out (see the module docstring), replies."""

    name = "retrying"
    model = "retrying-1"

    async def stream(self, request: ModelRequest, signal: asyncio.Event) -> AsyncIterator[StreamEvent]:
        gates = Path(os.environ.get("CUBEPI_TEST_GATES", "."))
        await _until(gates / FAILED, signal, float("inf"))
        if not signal.is_set():
            yield RetryWait(WAIT_SECONDS, "rate limited", 1, 5)
            await _until(gates / DONE, signal, WAIT_SECONDS)
        if signal.is_set():
            yield StreamEnd(error_reply(self, ABORTED_TEXT, stop_reason="aborted"))
            return
        for i in range(0, len(REPLY), 4):
            yield TextDelta(0, REPLY[i : i + 4])
        yield StreamEnd(
            AssistantMessage(
                content=[TextContent(text=REPLY)], stop_reason="stop", provider_id=self.name, model_id=self.model
            )
        )


async def _until(gate: Path, signal: asyncio.Event, seconds: float) -> None:
    """Sleep until ``gate`` exists, ``signal`` is set or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not gate.exists() and not signal.is_set():
        await asyncio.sleep(0.02)


def make_agent() -> AgentSpec:
    """The runner's ``--agent`` factory: :class:`RetryingProvider`, no tools."""
    return AgentSpec(RetryingProvider())
