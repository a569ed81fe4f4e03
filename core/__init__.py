"""cubepi-tui's agent runtime, usable headless from any program.

The small public surface: the :class:`Agent` and its state, tools, message types and
events. Providers and checkpointers are imported by path (``core.providers.faux``,
``core.providers.anthropic``, ``core.checkpoint.memory``, ...), so importing ``core``
loads no optional driver.
"""

from core.agent import Agent, AgentState, RunningTool
from core.events import AgentEvent, RunOutcome
from core.jobs import idempotent
from core.messages import AssistantMessage, Message, ToolResultMessage, UserMessage
from core.tools import AgentTool, AgentToolResult, ToolContext, tool

__all__ = [
    "Agent",
    "AgentEvent",
    "AgentState",
    "AgentTool",
    "AgentToolResult",
    "AssistantMessage",
    "Message",
    "RunOutcome",
    "RunningTool",
    "ToolContext",
    "ToolResultMessage",
    "UserMessage",
    "idempotent",
    "tool",
]
