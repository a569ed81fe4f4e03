"""Child process that writes one thread with the real cubeloop (0.15.3): its own ``Agent``,
``FauxProvider`` and ``SQLiteCheckpointer``; nothing of this project is imported.

Usage: ``python cubeloop_child.py DB_PATH SCENARIO THREAD_ID CLOCK [ARG]``

The child prints ``MARK <name>`` lines on stdout (flushed) at known moments - a model call
in flight (``model_thinking``), a tool started (``tool_started:<tool>``), a listener holding
the run right after a result was saved (``listener_blocked``) - and then waits, so the
parent can SIGKILL it exactly there (see ``tests/helpers/cubeloop_threads.py``). Scenarios
that end by themselves print ``MARK done`` and exit 0.

``CLOCK`` (unix seconds) is this process's wall clock, held still: cubeloop stamps every
message ``timestamp`` with ``time.time()``, and a fixed clock makes views that show clock
times and the faux provider's token counts (which count the serialised messages) the same
on every run. Rows' ``created_at`` still come from SQLite's own clock.

``ARG`` is a scenario's extra input: ``"SOURCE RUN_ID"`` for ``fork``, the run id for
``ask_and_detach`` and ``approve_and_detach``, the human's answer for ``respond``, the
prompt for ``continue``.

Scenarios: ``crash_after_user``, ``crash_after_tool_result``, ``crash_mid_tool``,
``completed``, ``aborted``, ``batch_sequential``, ``batch_parallel``,
``batch_parallel_listener_blocked`` (the crash-point threads, see
``tests/helpers/cubeloop_threads.py``); ``two_runs`` (two completed runs with tool turns
and a thinking block), ``fork``, ``steer``, ``images``, ``ask_and_detach`` (cubeloop's
HITL: the question stays pending), ``approve_and_detach`` (an ``ApprovalPolicyMiddleware``
asks before ``delete_file`` runs, and stays pending), ``respond`` (given the answer),
``respond_stored`` (the answer someone else stored: ``load_pending`` + ``load_hitl_answer`` +
``respond``; its model replies with the last tool result's text, so the parent sees what the
model saw) and ``continue``.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import sys
import time
import zlib
from typing import Any

from cubeloop import Agent, tool
from cubeloop.agent.types import AgentToolResult
from cubeloop.checkpointer import SQLiteCheckpointer
from cubeloop.hitl import ApprovalPolicyMiddleware, Approve, AskUser, CheckpointedChannel, ask_user_tool
from cubeloop.providers import FauxProvider
from cubeloop.providers.base import ImageContent, TextContent, ThinkingContent, UserMessage
from cubeloop.providers.faux import faux_assistant_message, faux_tool_call

FILE_TEXT = ("test path line module file def import value self return " * 100)[:1024]
"""What ``read_file`` returns (1,024 characters)."""


def _png_1x1() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0\xff\x00\x00\xff"))
        + chunk(b"IEND", b"")
    )


PIXEL_PNG = base64.b64encode(_png_1x1()).decode()
"""A 1x1 PNG, base64: the image cubeloop threads carry (``source`` + ``media_type``)."""

SYSTEM = "You are a careful coding assistant."
FINAL = "src/app.py defines the CLI entry point; nothing to change."


def mark(name: str) -> None:
    print(f"MARK {name}", flush=True)


async def hold() -> None:
    """Wait to be killed (an hour is far beyond any test's bound)."""
    await asyncio.sleep(3600)


@tool
async def read_file(path: str) -> str:
    """Read a file."""
    mark(f"tool_done:read_file:{path}")
    return FILE_TEXT


@tool
async def slow_step(label: str) -> str:
    """A long step, not safe to repeat."""
    mark("tool_started:slow_step")
    await hold()
    return f"{label} done"


@tool
async def wait_for_abort(label: str, signal: asyncio.Event | None = None) -> str:
    """Wait until aborted."""
    mark("tool_started:wait_for_abort")
    assert signal is not None
    await signal.wait()
    return "interrupted: abort signal received"


@tool
async def delete_file(path: str) -> str:
    """Delete a file (a side effect that needs a person's approval)."""
    mark(f"tool_done:delete_file:{path}")
    return f"deleted {path}"


def approval_policy(ctx: Any) -> Any:
    """Ask a person before every ``delete_file`` call; approve the rest."""
    if ctx.tool_call.name == "delete_file":
        return AskUser(details={"why": "deletes a file"})
    return Approve()


def echo_last_result(messages: Any, _model: Any) -> Any:
    """A model reply quoting the last tool result's text: what the model was given."""
    result = [m for m in messages if m.role == "tool_result"][-1]
    seen = " ".join(b.text for b in result.content if getattr(b, "type", "") == "text")
    return reply(text(f"The tool said: {seen}"))


@tool
async def screenshot(name: str) -> AgentToolResult:
    """Take a screenshot."""
    return AgentToolResult(
        content=[TextContent(text=f"screenshot {name}"), ImageContent(source=PIXEL_PNG, media_type="image/png")]
    )


@tool
async def steerable_step(label: str) -> str:
    """A step during which the host steers."""
    mark("tool_started:steerable_step")
    await asyncio.sleep(0.2)
    return f"{label} done"


async def thinking_model(*_: Any) -> Any:
    """A model call that never finishes on its own: the parent kills the child during it."""
    mark("model_thinking")
    await hold()


def reply(*blocks: Any, stop: str | None = None) -> Any:
    """An assistant message; ``tool_use`` when it holds tool calls."""
    has_calls = any(getattr(b, "type", "") == "tool_call" for b in blocks)
    return faux_assistant_message(list(blocks), stop_reason=stop or ("tool_use" if has_calls else "stop"))


def text(value: str) -> TextContent:
    return TextContent(text=value)


def prompt_text(thread_id: str) -> str:
    return f"Scenario {thread_id}: please inspect src/app.py and report."


async def scenario(name: str, store: SQLiteCheckpointer, thread_id: str, arg: str) -> None:
    provider = FauxProvider(provider_id="faux")
    model = provider.model("faux-1")
    tools = [read_file, slow_step, wait_for_abort]
    if name in ("images", "steer"):
        tools += [screenshot, steerable_step]

    def agent(**kw: Any) -> Agent:
        return Agent(model=model, system_prompt=SYSTEM, tools=tools, checkpointer=store, thread_id=thread_id, **kw)

    read1 = faux_tool_call("read_file", {"path": "src/app.py"}, id="call_read_1")
    if name == "crash_after_user":
        provider.set_responses([thinking_model])
        await agent().prompt(prompt_text(thread_id))
    elif name == "crash_after_tool_result":
        provider.set_responses([reply(read1), thinking_model])
        await agent().prompt(prompt_text(thread_id))
    elif name == "crash_mid_tool":
        provider.set_responses([reply(faux_tool_call("slow_step", {"label": "build"}, id="call_slow_1"))])
        await agent().prompt(prompt_text(thread_id))
    elif name == "completed":
        provider.set_responses([reply(read1), reply(text(FINAL))])
        await agent().prompt(prompt_text(thread_id))
    elif name == "aborted":
        provider.set_responses(
            [reply(faux_tool_call("wait_for_abort", {"label": "long job"}, id="call_wait_1")), reply(text("unreached"))]
        )
        a = agent()

        def on_event(event: Any, signal: Any = None) -> None:
            if event.type == "tool_execution_start":
                a.abort()

        a.subscribe(on_event)
        await a.prompt(prompt_text(thread_id))
    elif name in ("batch_sequential", "batch_parallel"):
        slow2 = faux_tool_call("slow_step", {"label": "build"}, id="call_slow_2")
        provider.set_responses([reply(read1, slow2)])
        mode = "sequential" if name == "batch_sequential" else "parallel"
        await agent(tool_execution=mode).prompt(prompt_text(thread_id))
    elif name == "batch_parallel_listener_blocked":
        read2 = faux_tool_call("read_file", {"path": "src/cli.py"}, id="call_read_2")
        provider.set_responses([reply(read1, read2)])
        a = agent()

        async def on_event(event: Any, signal: Any = None) -> None:
            # Listeners run after the checkpoint append: the first result is saved, the second not yet.
            if event.type == "message_end" and event.message.role == "tool_result":
                mark("listener_blocked")
                await hold()

        a.subscribe(on_event)
        await a.prompt(prompt_text(thread_id))
    elif name == "two_runs":
        # Two completed runs with tool turns, thinking and text: the thread a fork starts from.
        provider.set_responses(
            [
                reply(ThinkingContent(thinking="Read the file first."), read1),
                reply(text(FINAL)),
                reply(faux_tool_call("read_file", {"path": "src/cli.py"}, id="call_read_2")),
                reply(text("src/cli.py parses the arguments.")),
            ]
        )
        a = agent()
        await a.prompt(prompt_text(thread_id))
        await a.prompt("And src/cli.py?")
    elif name == "fork":
        # ARG = "SOURCE_THREAD RUN_ID": fork after that run, then continue the fork.
        source, run_id = arg.split()
        provider.set_responses([reply(text("Forked: src/app.py looks fine."))])
        a = agent()
        await a.fork(source, thread_id, after_run_id=run_id, metadata={"reason": "try another answer"})
        await a.prompt("Answer again, in one line.")
    elif name == "steer":
        provider.set_responses(
            [
                reply(faux_tool_call("steerable_step", {"label": "lint"}, id="call_steer_1")),
                reply(text("Steered: tests first.")),
            ]
        )
        a = agent()

        def on_event(event: Any, signal: Any = None) -> None:
            if event.type == "tool_execution_start":
                a.steer(UserMessage(content=[text("Run the tests first.")]))

        a.subscribe(on_event)
        await a.prompt(prompt_text(thread_id))
    elif name == "images":
        provider.set_responses(
            [
                reply(faux_tool_call("screenshot", {"name": "home"}, id="call_shot_1")),
                reply(text("The page shows one pixel.")),
            ]
        )
        message = UserMessage(
            content=[text(prompt_text(thread_id)), ImageContent(source=PIXEL_PNG, media_type="image/png")],
            timestamp=time.time(),
        )
        await agent().prompt(message)
    elif name == "ask_and_detach":
        # A human question (cubeloop's HITL): the run asks, then the host detaches, leaving
        # the question pending in thread_pending_request for a later respond().
        run_id = arg
        channel = CheckpointedChannel(checkpointer=store, thread_id=thread_id, run_id=run_id)
        ask = faux_tool_call(
            "ask_user", {"questions": [{"key": "target", "prompt": "Which file should I check?"}]}, id="call_ask_1"
        )
        provider.set_responses([reply(ask)])
        a = Agent(
            model=model,
            system_prompt=SYSTEM,
            tools=[*tools, ask_user_tool(channel)],
            checkpointer=store,
            thread_id=thread_id,
            channel=channel,
        )

        async def on_event(event: Any, signal: Any = None) -> None:
            if event.type == "hitl_request":
                mark("asked")
                await a.detach()

        a.subscribe(on_event)
        await a.prompt(prompt_text(thread_id), run_id=run_id)
    elif name == "respond":
        # ARG = the human's answer to the pending question of THREAD_ID.
        channel = CheckpointedChannel(
            checkpointer=store, thread_id=thread_id, run_id=await store.load_pending_run_id(thread_id)
        )
        provider.set_responses([reply(text(f"Checking {arg} as you asked."))])
        a = Agent(
            model=model,
            system_prompt=SYSTEM,
            tools=[*tools, ask_user_tool(channel)],
            checkpointer=store,
            thread_id=thread_id,
            channel=channel,
        )
        await a.respond(answer={"target": arg})
    elif name in ("approve_and_detach", "respond_stored"):
        # cubeloop's HITL end to end with its own channel: the first asks (an approval before
        # delete_file runs) and detaches; the second continues with the stored answer.
        if name == "approve_and_detach":
            run_id: str | None = arg
            pending = None
        else:
            loaded = await store.load_pending(thread_id)
            if loaded is None:
                raise SystemExit("respond_stored: no pending request")
            pending, run_id = loaded
        channel = CheckpointedChannel(checkpointer=store, thread_id=thread_id, run_id=run_id)
        a = Agent(
            model=model,
            system_prompt=SYSTEM,
            tools=[*tools, delete_file, ask_user_tool(channel)],
            middleware=[ApprovalPolicyMiddleware(channel, approval_policy)],
            checkpointer=store,
            thread_id=thread_id,
            channel=channel,
        )
        if pending is None:
            delete = faux_tool_call("delete_file", {"path": "/etc/k"}, id="call_del_1")
            provider.set_responses([reply(text("Deleting it."), delete)])

            async def on_event(event: Any, signal: Any = None) -> None:
                if event.type == "hitl_request":
                    mark("asked")
                    await a.detach()

            a.subscribe(on_event)
            await a.prompt(prompt_text(thread_id), run_id=run_id)
        else:
            stored = await store.load_hitl_answer(thread_id, pending.question_id, run_id=run_id)
            if stored is None:
                raise SystemExit(f"respond_stored: no answer stored for {pending.question_id!r}")
            provider.set_responses([echo_last_result])
            await a.respond(question_id=pending.question_id, answer=stored)
    elif name == "continue":
        # Continue a thread someone else wrote with one more prompt (ARG: the prompt).
        provider.set_responses([reply(text("Continued by cubeloop."))])
        await agent().prompt(arg)
    else:
        raise SystemExit(f"unknown scenario {name!r}")


async def main(db_path: str, name: str, thread_id: str, arg: str) -> None:
    async with SQLiteCheckpointer(db_path) as store:
        await scenario(name, store, thread_id, arg)
    mark("done")


if __name__ == "__main__":
    db, scenario_name, thread, clock = sys.argv[1:5]
    extra = sys.argv[5] if len(sys.argv) > 5 else ""
    frozen = float(clock)
    time.time = lambda: frozen  # type: ignore[assignment]  # see the module docstring
    asyncio.run(main(db, scenario_name, thread, extra))
