"""Child processes for the human-request tests: a runner whose tool call waits for a
person's approval, a resumer, and an answerer, each on a real store in its own process.

Usage (from the repository root)::

    python -m tests.helpers.hitl_child LOCATION SCENARIO THREAD_ID EFFECTS [ARG]

``LOCATION`` is a SQLite path or a server URL (``core.checkpoint.locations.open_store``;
a Redis URL carries its key prefix as ``?prefix=``). ``EFFECTS`` is a file the tool
appends one line to each time its body runs, so the parent counts the runs across
processes. Marks (``MARK <name>``, flushed) tell the parent where the child is:

* ``run`` - prompt the agent: the model calls ``delete_file`` on ``/etc/passwd``
  (``approvals={"delete_file": ALWAYS}``), then answers with the text of the result it
  was sent (``saw: ...``), so the parent sees what the model saw. ``MARK waiting`` once the
  request is persisted; ``MARK outcome:<outcome>`` and ``MARK done`` at the end. ``ARG``
  ``timeout`` gives the rule a 0.5 s timeout without default, ``default`` a 1 s timeout
  with the default ``deny``; ``detach`` detaches as soon as it waits; ``slow`` makes the
  tool print ``MARK tool_started`` after its effect and sleep (to be killed there).
* ``supervised`` - ``run`` under a :class:`core.supervisor.Supervisor`, so the parent can
  abort it through the store's commands (``core.commands.send``).
* ``resume`` - resume the thread (same agent definition); ``MARK outcome:...``, ``MARK done``.
* ``answer`` - read the pending request, print ``MARK ready``, wait for ``EFFECTS +
  ".go"`` to exist (so racers insert together), then answer with ``ARG`` (``approve`` or
  ``deny``): ``MARK answered:<ARG>`` or ``MARK already:<ARG>``, then ``MARK done``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from core.agent import Agent
from core.approvals import ALWAYS, always
from core.checkpoint.locations import open_store
from core.errors import AlreadyAnsweredError
from core.events import HumanRequestStarted
from core.hitl import ApprovalAnswer
from core.hitl_replies import dump_answer
from core.messages import AssistantMessage, ToolResultMessage
from core.providers.base import ModelRequest
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.supervisor import Supervisor
from core.tools import ToolContext, tool

PROMPT = "Clean up /etc, please."
CALL_ID = "call_del_1"
REASON = "not on this machine"
"""The reason a denial gives (the model's tool result reads it)."""


def mark(name: str) -> None:
    print(f"MARK {name}", flush=True)


def seen(request: ModelRequest) -> AssistantMessage:
    """The faux model's answer to a tool result: ``saw: <the result's text>``, so a test
    reads from the thread what the model was sent (the tool's output, or a denial's reason)."""
    last = request.messages[-1]
    text = "".join(b.text for b in last.content if b.type == "text") if isinstance(last, ToolResultMessage) else ""
    return faux_reply(f"saw: {text}")


def asking_reply() -> AssistantMessage:
    """The faux model's first answer: ``delete_file`` on ``/etc/passwd`` (call ``CALL_ID``)."""
    return faux_reply("Deleting.", faux_tool_call("delete_file", {"path": "/etc/passwd"}, id=CALL_ID))


def agent_for(store, thread_id: str, effects: str, arg: str, *, resuming: bool = False) -> Agent:
    @tool
    async def delete_file(path: str, ctx: ToolContext) -> str:
        """Delete a file."""
        with open(effects, "a", encoding="utf-8") as f:
            f.write(f"delete_file {path} pid={os.getpid()}\n")
        if arg == "slow":
            mark("tool_started")
            await asyncio.sleep(3600)
        return f"deleted {path}"

    # A resumer's model is asked only after the waiting call has its result.
    first = [] if resuming else [asking_reply()]
    provider = FauxProvider([*first, seen])
    rules = {"timeout": always(timeout=0.5), "default": always(timeout=1.0, default="deny")}
    rule = rules.get(arg, ALWAYS)
    return Agent(provider, store, thread_id, tools=[delete_file], approvals={"delete_file": rule})


async def run(location: str, scenario: str, thread_id: str, effects: str, arg: str) -> None:
    store = await open_store(location, create=True)
    try:
        if scenario == "answer":
            await answer(store, thread_id, effects, arg)
            return
        agent = agent_for(store, thread_id, effects, arg, resuming=scenario == "resume")

        def on_event(event) -> None:
            if isinstance(event, HumanRequestStarted):
                mark("waiting")
                if arg == "detach":
                    assert agent.detach()

        agent.subscribe(on_event)
        if scenario == "supervised":
            outcome = await Supervisor(agent).prompt(PROMPT)
        else:
            outcome = await (agent.prompt(PROMPT) if scenario == "run" else agent.resume())
        mark(f"outcome:{outcome}")
    finally:
        await store.close()


async def answer(store, thread_id: str, effects: str, decision: str) -> None:
    # The request is read first, as a person reads the question before answering; then
    # both racers wait for the go file so their inserts meet.
    data = await store.load(thread_id)
    pending = data.pending_request
    qid = json.loads(pending.request_json)["question_id"]
    mark("ready")
    go = effects + ".go"
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    value = (
        ApprovalAnswer(decision="approve") if decision == "approve" else ApprovalAnswer(decision="deny", reason=REASON)
    )
    try:
        await store.answer(thread_id, pending.run_id, qid, dump_answer(value))
    except AlreadyAnsweredError:
        mark(f"already:{decision}")
    else:
        mark(f"answered:{decision}")


if __name__ == "__main__":
    location, scenario, thread_id, effects = sys.argv[1:5]
    asyncio.run(run(location, scenario, thread_id, effects, sys.argv[5] if len(sys.argv) > 5 else ""))
    mark("done")
