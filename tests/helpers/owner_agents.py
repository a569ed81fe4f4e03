"""Two definitions of one small agent, for runner children that must differ only in a tool's
parameter schema:

    python -m core.runner run --db DB --thread T --agent tests.helpers.owner_agents:v1 PROMPT
    python -m core.runner run --db DB --thread T --agent tests.helpers.owner_agents:v2 PROMPT

Both answer every request with :data:`REPLY` (a faux provider, no tool call) and carry one
tool, ``lookup``: ``v1``'s takes ``query``, ``v2``'s ``query`` and ``limit``, so a thread
started with one and continued with the other reads "tool lookup: parameters changed".
"""

from __future__ import annotations

from core.providers.faux import FauxProvider
from core.runner import AgentSpec
from core.tools import tool

REPLY = "Noted."
"""What the model answers, every time."""

SYSTEM_PROMPT = "You look things up."


@tool(name="lookup")
async def _lookup_v1(query: str) -> str:
    """Look ``query`` up."""
    return f"found {query}"


@tool(name="lookup")
async def _lookup_v2(query: str, limit: int = 5) -> str:
    """Look ``query`` up, at most ``limit`` results."""
    return f"found {query} (at most {limit})"


def _provider() -> FauxProvider:
    return FauxProvider(fallback=lambda request: REPLY)


def v1() -> AgentSpec:
    """The first definition: ``lookup(query)``."""
    return AgentSpec(_provider(), [_lookup_v1], SYSTEM_PROMPT)


def v2() -> AgentSpec:
    """The second definition: ``lookup(query, limit)``."""
    return AgentSpec(_provider(), [_lookup_v2], SYSTEM_PROMPT)
