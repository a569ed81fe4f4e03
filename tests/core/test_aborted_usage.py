"""A run aborted mid-stream saves the usage the provider reported so far on its aborted reply
(issue 7: "usage of an aborted turn is never recorded"), with the faux provider and with the
Anthropic provider over real HTTP."""

from __future__ import annotations

import asyncio

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.events import MessageUpdate, TextDelta
from core.messages import AssistantMessage, Usage
from core.providers.anthropic import AnthropicProvider
from core.providers.faux import FauxProvider, faux_reply
from core.recovery import ThreadState, diagnose
from tests.helpers.messages_server import Hold, MessagesServer, Stream, block_delta, block_start, message_start

WAIT = 30.0  # seconds; reached only by a failing test
PROMPT = "Summarise the quarterly sales figures, please."  # 46 characters: 12 faux tokens


def abort_on_first_text(agent: Agent) -> None:
    def listener(event: object) -> None:
        if isinstance(event, MessageUpdate) and isinstance(event.delta, TextDelta) and event.message.text:
            agent.abort()

    agent.subscribe(listener)


async def saved_reply(store: MemoryCheckpointer, thread_id: str) -> AssistantMessage:
    data = await store.load(thread_id)
    assert data is not None
    assert diagnose(data.messages, data.runs).state is ThreadState.ABORTED
    last = data.messages[-1]
    assert isinstance(last, AssistantMessage) and last.stop_reason == "aborted"
    return last


async def test_the_faux_provider_aborted_mid_stream_saves_its_input_tokens():
    provider = FauxProvider([faux_reply("A long answer that the abort cuts short." * 5)], chunk_size=3, delay=0.002)
    store = MemoryCheckpointer()
    agent = Agent(provider, store, "t1")
    abort_on_first_text(agent)
    assert await asyncio.wait_for(agent.prompt(PROMPT), WAIT) == "aborted"
    reply = await saved_reply(store, "t1")
    assert 0 < len(reply.text) < 200
    assert reply.usage == Usage(input_tokens=12, output_tokens=0)


async def test_the_anthropic_provider_aborted_mid_stream_saves_the_usage_of_message_start():
    async with MessagesServer() as server:
        hold = Hold()  # the model goes quiet after its first words; the abort must not wait for more
        server.add(
            Stream(
                [
                    message_start(1834, output_tokens=1, cache_read=12000, cache_write=250),
                    block_start(0, {"type": "text", "text": ""}),
                    block_delta(0, {"type": "text_delta", "text": "The quarter"}),
                    hold,
                ]
            )
        )
        provider = AnthropicProvider("claude-test-1", api_key="k", base_url=server.base_url)
        store = MemoryCheckpointer()
        agent = Agent(provider, store, "t2")
        abort_on_first_text(agent)
        assert await asyncio.wait_for(agent.prompt(PROMPT), WAIT) == "aborted"
        assert hold.reached.is_set() and not hold.released.is_set()
        reply = await saved_reply(store, "t2")
    assert reply.text == "The quarter"
    assert reply.usage == Usage(input_tokens=1834, output_tokens=1, cache_read_tokens=12000, cache_write_tokens=250)
