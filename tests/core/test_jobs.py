"""Idempotent tools as jobs: deterministic keys, work done once, done results reused, failures re-run."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.events import ToolExecutionStart, ToolExecutionUpdate
from core.jobs import Jobs, canonical_json, idempotent, job_key, key_for
from core.messages import TextContent, ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.tool_execution import result_from_json, result_to_json
from core.tools import AgentToolResult, ToolContext, tool
from tests.helpers.stores import PlainStore
from tests.helpers.transcripts import assert_every_call_answered

WAIT = 10.0  # seconds; reached only by a failing test


# --- keys -----------------------------------------------------------------------------------


def test_job_key_ignores_argument_order_and_whitespace():
    a = job_key("fetch", {"url": "https://x", "depth": 2, "opts": {"b": 1, "a": [1, 2]}})
    b = job_key("fetch", {"opts": {"a": [1, 2], "b": 1}, "depth": 2, "url": "https://x"})
    assert a == b
    name, digest = a.split(":")
    assert name == "fetch" and len(digest) == 64 and int(digest, 16) >= 0
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


@pytest.mark.parametrize(
    "other",
    [
        ("fetch", {"url": "https://y", "depth": 2}),
        ("fetch", {"url": "https://x", "depth": 3}),
        ("fetch", {"url": "https://x"}),
        ("crawl", {"url": "https://x", "depth": 2}),
        ("fetch", {"url": "https://x", "depth": "2"}),
    ],
)
def test_different_arguments_or_tools_give_different_keys(other):
    assert job_key("fetch", {"url": "https://x", "depth": 2}) != job_key(*other)


@pytest.mark.parametrize(
    "args",
    [{"url": "https://x", "depth": 2}, {"name": "caf\u00e9 \u65e5\u672c", "emoji": "\U0001f600"}, {}],
)
def test_a_key_is_the_sha256_of_the_strict_utf8_canonical_json(args):
    # The documented formula, for every argument UTF-8 can encode: keys stored by older
    # versions must still find their jobs.
    digest = hashlib.sha256(canonical_json(args).encode("utf-8")).hexdigest()
    assert job_key("fetch", args) == f"fetch:{digest}"


def test_a_key_stored_by_an_older_version_is_still_the_key():
    # Computed once with the released formula; a changed key would orphan every stored job.
    assert job_key("fetch", {"url": "https://x", "depth": 2}) == (
        "fetch:834d243bf428d842a180f9a2605601b1ea9c56118f2e080a9d0a048acf4b372a"
    )


def test_arguments_with_undecodable_bytes_get_a_key_of_their_own():
    # A lone surrogate (b"\xff" read with surrogateescape) has no strict UTF-8 form.
    name = b"caf\xff.txt".decode("utf-8", "surrogateescape")
    key = job_key("stat", {"path": name})
    assert key == job_key("stat", {"path": name}) and len(key.split(":")[1]) == 64
    others = {job_key("stat", {"path": p}) for p in ("caf\ufffd.txt", "caf\\udcff.txt", "caf.txt", "caf\udcfe.txt")}
    assert key not in others and len(others) == 4


def test_custom_keys_are_namespaced_by_tool_and_must_be_strings():
    assert key_for("charge", {"order": "o-1", "note": "x"}, lambda a: a["order"]) == "charge:o-1"
    with pytest.raises(ValueError, match="non-empty string"):
        key_for("charge", {"order": 1}, lambda a: a["order"])
    with pytest.raises(TypeError, match="must be a function"):
        idempotent(plain_tool(), key="order")  # type: ignore[arg-type]


def plain_tool():
    @tool
    async def plain(x: int) -> str:
        """Do nothing."""
        return str(x)

    return plain


def test_idempotent_wrapper_copies_the_tool():
    original = plain_tool()
    wrapped = idempotent(original, key=lambda a: str(a["x"]))
    assert wrapped.idempotent and wrapped.job_key_from is not None and wrapped.name == "plain"
    assert not original.idempotent and original.job_key_from is None


def test_a_stored_result_round_trips():
    result = AgentToolResult([TextContent(text="rows: 3")], details={"rows": 3}, is_error=False)
    again = result_from_json(result_to_json(result))
    assert (again.blocks(), again.details, again.is_error) == (result.blocks(), {"rows": 3}, False)
    assert result_from_json({"unexpected": True}).content == '{"unexpected": true}'


# --- an agent running idempotent tools --------------------------------------------------------


class Counter:
    """Side effects of the tools under test, and the job keys they were given."""

    def __init__(self) -> None:
        self.done: list[Any] = []
        self.keys: list[str | None] = []
        self.fail_next = 0


def fetch_tool(counter: Counter):
    @tool(idempotent=True)
    async def fetch(url: str, ctx: ToolContext, depth: int = 1) -> str:
        """Fetch a page (a side effect we count)."""
        counter.keys.append(ctx.job_key)
        if counter.fail_next:
            counter.fail_next -= 1
            raise ConnectionError(f"could not reach {url}")
        counter.done.append((url, depth))
        return f"page {url} at depth {depth} (fetch #{len(counter.done)})"

    return fetch


def calling(*calls) -> list:
    """A script: one reply per call (each followed by a final answer)."""
    script: list = []
    for name, args in calls:
        script += [faux_reply(faux_tool_call(name, args)), "ok"]
    return script


def results(messages) -> list[ToolResultMessage]:
    return [m for m in messages if isinstance(m, ToolResultMessage)]


async def test_an_idempotent_tool_does_its_work_once_per_key_in_a_thread():
    counter = Counter()
    store = MemoryCheckpointer()
    provider = FauxProvider(
        calling(
            ("fetch", {"url": "a"}),
            ("fetch", {"depth": 1, "url": "a"}),  # same job: order and defaults do not matter
            ("fetch", {"url": "b"}),
        )
    )
    agent = Agent(provider, store, "t", tools=[fetch_tool(counter)])
    for text in ("one", "two", "three"):
        assert await asyncio.wait_for(agent.prompt(text), WAIT) == "completed"

    assert counter.done == [("a", 1), ("b", 1)]
    first, second, third = results((await store.load("t")).messages)
    assert first.text == second.text == "page a at depth 1 (fetch #1)"
    assert (first.metadata, second.metadata, third.metadata) == ({}, {"job": "reused"}, {})
    key_a = job_key("fetch", {"url": "a", "depth": 1})
    assert counter.keys == [key_a, job_key("fetch", {"url": "b", "depth": 1})]  # the tool got its key
    record = await store.job_get("t", key_a)
    assert (record.status, record.attempts, record.tool_call_id) == ("done", 1, first.tool_call_id)
    assert result_from_json(record.result).content == first.content
    assert_every_call_answered(provider.requests)


async def test_identical_calls_in_one_parallel_batch_do_the_work_once():
    counter = Counter()
    started = asyncio.Event()
    release = asyncio.Event()

    @tool(idempotent=True)
    async def charge(order: int) -> str:
        """Charge an order (a side effect we count); slow, so the two calls overlap."""
        counter.done.append(order)
        started.set()
        await release.wait()
        return f"charged order {order}"

    store = MemoryCheckpointer()
    batch = faux_reply(faux_tool_call("charge", {"order": 7}), faux_tool_call("charge", {"order": 7}))
    agent = Agent(FauxProvider([batch, "ok"]), store, "t", tools=[charge], tool_execution="parallel")
    run = asyncio.create_task(agent.prompt("go"))
    await asyncio.wait_for(started.wait(), WAIT)
    await asyncio.sleep(0.05)  # the sibling is waiting now, not working
    assert counter.done == [7]
    release.set()
    assert await asyncio.wait_for(run, WAIT) == "completed"
    assert counter.done == [7]
    first, second = results((await store.load("t")).messages)
    assert first.text == second.text == "charged order 7" and first.tool_call_id != second.tool_call_id
    assert sorted([first.metadata, second.metadata], key=len) == [{}, {"job": "reused"}]


async def test_a_sibling_runs_the_work_itself_when_the_first_call_fails():
    counter = Counter()
    counter.fail_next = 1
    store = MemoryCheckpointer()
    batch = faux_reply(faux_tool_call("fetch", {"url": "a"}), faux_tool_call("fetch", {"url": "a"}))
    agent = Agent(FauxProvider([batch, "ok"]), store, "t", tools=[fetch_tool(counter)], tool_execution="parallel")
    assert await asyncio.wait_for(agent.prompt("go"), WAIT) == "completed"
    first, second = results((await store.load("t")).messages)
    assert [first.is_error, second.is_error] == [True, False] or [first.is_error, second.is_error] == [False, True]
    assert counter.done == [("a", 1)] and len(counter.keys) == 2


async def test_the_start_event_and_journal_carry_the_job_key():
    counter = Counter()
    store = MemoryCheckpointer()
    agent = Agent(FauxProvider(calling(("fetch", {"url": "a"}))), store, "t", tools=[fetch_tool(counter)])
    starts = []
    agent.subscribe(lambda e: starts.append(e) if isinstance(e, ToolExecutionStart) else None)
    await agent.prompt("go")
    key = job_key("fetch", {"url": "a", "depth": 1})
    assert [s.job_key for s in starts] == [key]
    journal = await store.load_journal("t")
    assert [e.job_key for e in journal.values()] == [key]


async def test_jobs_are_per_thread():
    counter = Counter()
    store = MemoryCheckpointer()
    for thread in ("t1", "t2"):
        agent = Agent(FauxProvider(calling(("fetch", {"url": "a"}))), store, thread, tools=[fetch_tool(counter)])
        await agent.prompt("go")
    assert len(counter.done) == 2


async def test_a_failed_job_is_recorded_and_runs_again():
    counter = Counter()
    counter.fail_next = 1
    store = MemoryCheckpointer()
    provider = FauxProvider(calling(("fetch", {"url": "a"}), ("fetch", {"url": "a"})))
    agent = Agent(provider, store, "t", tools=[fetch_tool(counter)])
    await agent.prompt("one")
    key = job_key("fetch", {"url": "a", "depth": 1})
    failed = await store.job_get("t", key)
    assert (failed.status, failed.result) == ("failed", "could not reach a")

    await agent.prompt("two")
    first, second = results((await store.load("t")).messages)
    assert first.is_error and first.text == "could not reach a"
    assert not second.is_error and second.metadata == {} and counter.done == [("a", 1)]
    done = await store.job_get("t", key)
    assert (done.status, done.attempts) == ("done", 2)


async def test_an_error_result_is_not_stored_as_done():
    calls = []

    @tool(idempotent=True)
    async def flaky(n: int) -> AgentToolResult:
        """Report a failure as a result the first time."""
        calls.append(n)
        return AgentToolResult("busy, try later", is_error=True) if len(calls) == 1 else AgentToolResult("fine")

    store = MemoryCheckpointer()
    agent = Agent(FauxProvider(calling(("flaky", {"n": 1}), ("flaky", {"n": 1}))), store, "t", tools=[flaky])
    await agent.prompt("one")
    assert (await store.job_get("t", job_key("flaky", {"n": 1}))).status == "failed"
    await agent.prompt("two")
    assert calls == [1, 1]
    assert [r.text for r in results((await store.load("t")).messages)] == ["busy, try later", "fine"]


async def test_work_cut_short_by_an_abort_is_never_reused():
    ran = []

    @tool(idempotent=True)
    async def long_job(n: int, ctx: ToolContext) -> str:
        """Work until done or aborted (then return what it has, as tools may)."""
        ran.append(n)
        if len(ran) == 1:
            ctx.report(text="working")
            await ctx.signal.wait()
            return "partial: stopped early"
        return "complete"

    store = MemoryCheckpointer()
    provider = FauxProvider([faux_reply(faux_tool_call("long_job", {"n": 1})), *calling(("long_job", {"n": 1}))])
    agent = Agent(provider, store, "t", tools=[long_job])
    stop = agent.subscribe(lambda e: agent.abort() if isinstance(e, ToolExecutionUpdate) else None)
    assert await asyncio.wait_for(agent.prompt("one"), WAIT) == "aborted"
    stop()
    assert (await store.job_get("t", job_key("long_job", {"n": 1}))).status == "failed"
    assert await asyncio.wait_for(agent.prompt("two"), WAIT) == "completed"
    assert ran == [1, 1]
    assert results((await store.load("t")).messages)[-1].text == "complete"


async def test_a_custom_key_makes_calls_with_other_arguments_the_same_job():
    charges: list[str] = []

    @tool
    async def charge(order: str, amount: int, ctx: ToolContext, note: str = "") -> str:
        """Charge an order (pass the key on as the payment API's idempotency key)."""
        charges.append(f"{order}:{amount}:{ctx.job_key}")
        return f"charged {order}"

    store = MemoryCheckpointer()
    provider = FauxProvider(
        calling(("charge", {"order": "o-1", "amount": 5}), ("charge", {"order": "o-1", "amount": 5, "note": "again"}))
    )
    agent = Agent(provider, store, "t", tools=[idempotent(charge, key=lambda a: a["order"])])
    await agent.prompt("one")
    await agent.prompt("two")
    assert charges == ["o-1:5:charge:o-1"]
    assert (await store.job_get("t", "charge:o-1")).status == "done"


async def test_a_broken_key_function_fails_the_call_not_the_run():
    @tool
    async def charge(order: str) -> str:
        """Charge."""
        return "charged"

    agent = Agent(
        FauxProvider(calling(("charge", {"order": "o"}))),
        MemoryCheckpointer(),
        "t",
        tools=[idempotent(charge, key=lambda a: 7)],
    )
    assert await agent.prompt("go") == "completed"
    (result,) = results(agent.state.messages)
    assert result.is_error and result.text.startswith("Could not build the job key")


async def test_without_a_job_store_idempotent_tools_simply_run_and_still_get_their_key():
    counter = Counter()
    agent = Agent(
        FauxProvider(calling(("fetch", {"url": "a"}), ("fetch", {"url": "a"}))),
        PlainStore(),
        "t",
        tools=[fetch_tool(counter)],
    )
    await agent.prompt("one")
    await agent.prompt("two")
    assert len(counter.done) == 2
    assert counter.keys == [job_key("fetch", {"url": "a", "depth": 1})] * 2


async def test_jobs_run_records_exceptions_and_reraises():
    store = MemoryCheckpointer()
    jobs = Jobs(store, "t")

    async def boom():
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        await jobs.run("k", boom)
    assert (await jobs.get("k")).status == "failed"

    async def fine():
        return {"n": 1}, True

    first = await jobs.run("k", fine)
    again = await jobs.run("k", boom)  # done: the work is not called at all
    assert (first.reused, again.reused, again.value) == (False, True, {"n": 1})
