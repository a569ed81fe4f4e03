"""An agent whose one tool needs approval within a second, for runners in a child process.

    python -m core.runner run --db DB --thread T --agent tests.helpers.asking_agent:make_agent PROMPT

The faux model calls ``delete_file`` on ``/etc/passwd``; its rule is ``always(timeout=1)``
with no default, so unanswered the run ends **waiting** after a second.
"""

from __future__ import annotations

from core.approvals import always
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.runner import AgentSpec
from core.tools import tool

TIMEOUT = 1.0
"""Seconds the approval waits before the run ends waiting (no default is given)."""


@tool
async def delete_file(path: str) -> str:
    """Delete a file (it only says so: a test never deletes anything)."""
    return f"deleted {path}"


def make_agent() -> AgentSpec:
    """The spec: one asking reply, then a closing one for after an answer."""
    provider = FauxProvider(
        [
            faux_reply("Deleting.", faux_tool_call("delete_file", {"path": "/etc/passwd"}, id="call_del_1")),
            faux_reply("Done."),
        ]
    )
    return AgentSpec(provider, tools=[delete_file], approvals={"delete_file": always(timeout=TIMEOUT)})
