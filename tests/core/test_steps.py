"""Tool steps: a long tool commits its progress (``ToolContext.steps``), and re-running it after
a crash continues from its last committed step; the lesson's own workflow as a demo tool."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.demo import COUNT_WORDS_WORKFLOW, count_normalised_words, demo_provider, demo_tools, normalise_text
from core.errors import ConflictError, LeaseLostError
from core.events import ToolExecutionUpdate
from core.fingerprints import canonical_sha256
from core.jobs import job_key
from core.messages import ToolResultMessage
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.steps import StepLog, StepLogs, run_steps
from core.tools import ToolContext, tool
from tests.helpers.stores import PlainStore

WAIT = 10.0  # seconds; reached only by a failing test
OWNER = "alice"
LESSON = [normalise_text, count_normalised_words]


def log_of(store: MemoryCheckpointer, arguments: dict[str, Any], thread: str = "t1", **options: Any) -> StepLog:
    return StepLog(store, thread, job_key("count_words", arguments), arguments, **options)


# --- StepLog and run_steps ------------------------------------------------------------------


async def test_a_step_log_begins_at_step_zero_and_each_commit_is_one_revision() -> None:
    store = MemoryCheckpointer(OWNER)
    log = log_of(store, {"text": "a b"}, tool_call_id="call_1")
    record = await log.begin(workflow="w/1", total_steps=3)
    assert (record.next_step, record.revision, record.total_steps, record.data) == (0, 0, 3, None)
    assert record.input_fingerprint == canonical_sha256({"text": "a b"}) and record.tool_call_id == "call_1"
    first = await log.commit(1, {"seen": 1})
    second = await log.commit(2, {"seen": 2})
    assert (first.revision, second.revision, second.next_step, second.data) == (1, 2, 2, {"seen": 2})
    assert await store.step_get("t1", log.key) == second
    # Beginning again (a re-run) finds the record as committed.
    assert await log_of(store, {"text": "a b"}).begin(workflow="w/1", total_steps=3) == second


async def test_a_stale_writer_conflicts_and_writes_nothing() -> None:
    store = MemoryCheckpointer(OWNER)
    one, two = log_of(store, {"text": "x"}), log_of(store, {"text": "x"})
    await one.begin(workflow="w/1", total_steps=2)
    await two.begin(workflow="w/1", total_steps=2)
    await one.commit(1, "one")
    with pytest.raises(ConflictError) as stale:
        await two.commit(1, "two")
    assert (stale.value.expected, stale.value.actual) == (0, 1)
    stored = await store.step_get("t1", one.key)
    assert stored is not None and (stored.revision, stored.data) == (1, "one")


async def test_commit_needs_a_begin_and_a_step_within_the_total() -> None:
    log = log_of(MemoryCheckpointer(OWNER), {"text": "x"})
    with pytest.raises(RuntimeError, match="never begun"):
        await log.commit(1, "x")
    await log.begin(workflow="w/1", total_steps=2)
    with pytest.raises(ValueError, match="outside the 2 steps"):
        await log.commit(3, "x")


async def test_the_same_key_with_other_arguments_or_another_workflow_is_refused() -> None:
    store = MemoryCheckpointer(OWNER)
    await StepLog(store, "t1", "charge:order-1", {"cents": 100}).begin(workflow="w/1")
    with pytest.raises(ConflictError, match="same run requires the same input and workflow"):
        await StepLog(store, "t1", "charge:order-1", {"cents": 200}).begin(workflow="w/1")
    with pytest.raises(ConflictError, match="same run requires the same input and workflow"):
        await StepLog(store, "t1", "charge:order-1", {"cents": 100}).begin(workflow="w/2")


async def test_a_fenced_step_log_writes_nothing_once_its_holder_lost_the_lease() -> None:
    store = MemoryCheckpointer(OWNER)
    with pytest.raises(LeaseLostError):
        await log_of(store, {"text": "x"}, holder_id="nobody").begin(workflow="w/1")
    assert await store.step_get("t1", job_key("count_words", {"text": "x"})) is None


async def test_the_lessons_workflow_commits_its_two_outputs_and_is_unchanged_when_run_again() -> None:
    store = MemoryCheckpointer(OWNER)
    arguments = {"text": "Hello   Agent"}

    def count_but_crash(data: dict[str, str]) -> str:
        raise RuntimeError("killed before step 2 committed")

    with pytest.raises(RuntimeError):
        await run_steps(
            log_of(store, arguments),
            [normalise_text, count_but_crash],
            workflow=COUNT_WORDS_WORKFLOW,
            initial=arguments["text"],
        )
    after_one = await store.step_get("t1", job_key("count_words", arguments))
    assert after_one is not None
    assert (after_one.next_step, after_one.revision, after_one.data) == (1, 1, {"normalized": "hello agent"})

    # Re-run: step 1 is not run again (its committed data feeds step 2; `initial` is unused).
    ran: list[str] = []

    def normalise_counted(text: str) -> dict[str, str]:
        ran.append(text)
        return normalise_text(text)

    steps = [normalise_counted, count_normalised_words]
    assert await run_steps(log_of(store, arguments), steps, workflow=COUNT_WORDS_WORKFLOW, initial="?") == "words=2"
    assert ran == []
    done = await store.step_get("t1", job_key("count_words", arguments))
    assert done is not None and (done.next_step, done.total_steps, done.revision, done.data) == (2, 2, 2, "words=2")

    # Run again after done: nothing runs, nothing is written.
    changes = await store.change_token()
    assert await run_steps(log_of(store, arguments), steps, workflow=COUNT_WORDS_WORKFLOW, initial="?") == "words=2"
    assert ran == [] and await store.step_get("t1", done.key) == done and await store.change_token() == changes


async def test_without_a_step_store_every_step_runs_in_memory() -> None:
    assert await run_steps(None, LESSON, workflow=COUNT_WORDS_WORKFLOW, initial="Hello   Agent") == "words=2"

    async def doubled(n: int) -> int:
        return n * 2

    assert await run_steps(None, [doubled, doubled, lambda n: n + 1], workflow="w", initial=3) == 13


# --- given to tools -------------------------------------------------------------------------


def probe_tool(seen: list[Any], *, idempotent: bool) -> Any:
    @tool(name="probe", idempotent=idempotent)
    async def probe(n: int, ctx: ToolContext) -> str:
        """Report what the context holds."""
        seen.append(ctx.steps)
        return "ok"

    return probe


@pytest.mark.parametrize("idempotent", [True, False])
async def test_an_idempotent_call_gets_its_step_log_and_another_none(idempotent: bool) -> None:
    seen: list[Any] = []
    store = MemoryCheckpointer(OWNER)
    provider = FauxProvider([faux_reply("Probing.", faux_tool_call("probe", {"n": 1}, id="c1")), faux_reply("Ok.")])
    agent = Agent(provider, store, "t1", tools=[probe_tool(seen, idempotent=idempotent)])
    assert await agent.prompt("probe") == "completed"
    (steps,) = seen
    if not idempotent:
        assert steps is None
        return
    assert isinstance(steps, StepLog)
    assert steps.key == job_key("probe", {"n": 1}) and steps.tool_call_id == "c1" and steps.arguments == {"n": 1}
    assert steps.holder_id == agent.holder.holder_id  # fenced by the run's lease


async def test_a_store_without_tool_steps_gives_no_step_log() -> None:
    seen: list[Any] = []
    provider = FauxProvider([faux_reply("Probing.", faux_tool_call("probe", {"n": 1})), faux_reply("Ok.")])
    agent = Agent(provider, PlainStore(), "t1", tools=[probe_tool(seen, idempotent=True)])
    assert await agent.prompt("probe") == "completed"
    assert seen == [None]


async def test_step_logs_make_one_log_per_call() -> None:
    logs = StepLogs(MemoryCheckpointer(OWNER), "t1", "holder")
    log = logs.log("probe:k", {"n": 1}, "c1")
    assert (log.thread_id, log.key, log.arguments, log.tool_call_id, log.holder_id) == (
        "t1",
        "probe:k",
        {"n": 1},
        "c1",
        "holder",
    )


# --- a crash mid-tool, then resume ------------------------------------------------------------


def eight_steps(ran: list[int], stop_after: int | None, stopped: asyncio.Event) -> Any:
    @tool(name="build", idempotent=True)
    async def build(target: str, ctx: ToolContext) -> str:
        """Build a target in eight steps."""

        def step(i: int) -> Any:
            async def run(done: list[int]) -> list[int]:
                if stop_after is not None and i == stop_after:
                    stopped.set()
                    await asyncio.sleep(3600)  # the process dies here (the test cancels the run)
                ran.append(i + 1)
                return [*done, i + 1]

            return run

        data = await run_steps(ctx.steps, [step(i) for i in range(8)], workflow="build/1", initial=[])
        return f"built {target}: steps {data}"

    return build


async def test_resume_continues_a_stepped_tool_after_its_last_committed_step_and_the_plan_says_so() -> None:
    store = MemoryCheckpointer(OWNER)
    ran: list[int] = []
    stopped = asyncio.Event()
    call = faux_tool_call("build", {"target": "app"}, id="call_build")
    first = Agent(FauxProvider([faux_reply("Building.", call)]), store, "t1", tools=[eight_steps(ran, 4, stopped)])
    run = asyncio.create_task(first.prompt("build the app"))
    await asyncio.wait_for(stopped.wait(), WAIT)
    run.cancel()  # as a crash: the call has no result, its job is started, 4 steps committed
    with pytest.raises(asyncio.CancelledError):
        await run
    assert ran == [1, 2, 3, 4]
    key = job_key("build", {"target": "app"})
    record = await store.step_get("t1", key)
    assert record is not None and (record.next_step, record.total_steps, record.revision) == (4, 8, 4)

    ran.clear()
    provider = FauxProvider([faux_reply("Built.")])
    resumer = Agent(provider, store, "t1", tools=[eight_steps(ran, None, stopped)])
    plan = await resumer.plan_resume()
    (planned,) = plan.calls
    clock = time.strftime("%H:%M:%S", time.localtime(record.updated_at))
    assert planned.step == record and planned.step_words == f"step 4 of 8 committed at {clock}"
    assert f"step 4 of 8 committed at {clock}; it is idempotent, so it runs again, continuing after step 4." in (
        planned.words
    )
    assert planned.words in plan.sentence

    assert await resumer.resume() == "completed"
    assert ran == [5, 6, 7, 8]  # only the steps after the last committed one
    data = await store.load("t1")
    assert data is not None
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert result.text == "built app: steps [1, 2, 3, 4, 5, 6, 7, 8]"  # what an uninterrupted run returns
    assert result.metadata.get("settled") == "rerun"
    done = await store.step_get("t1", key)
    assert done is not None and (done.next_step, done.revision) == (8, 8)


async def test_a_plan_without_a_committed_step_says_nothing_of_steps() -> None:
    store = MemoryCheckpointer(OWNER)
    stopped = asyncio.Event()
    call = faux_tool_call("build", {"target": "app"}, id="call_build")
    first = Agent(FauxProvider([faux_reply("Building.", call)]), store, "t1", tools=[eight_steps([], 0, stopped)])
    run = asyncio.create_task(first.prompt("build the app"))
    await asyncio.wait_for(stopped.wait(), WAIT)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    (planned,) = (
        await Agent(FauxProvider([]), store, "t1", tools=[eight_steps([], None, stopped)]).plan_resume()
    ).calls
    assert planned.step is not None and planned.step.next_step == 0
    assert planned.step_words == "" and "step" not in planned.words.split(":", 1)[1]


# --- the demo agent's tools ------------------------------------------------------------------


async def test_the_demo_agent_runs_the_lessons_workflow_as_count_words() -> None:
    store = MemoryCheckpointer(OWNER)
    agent = Agent(demo_provider(speed=200), store, "t1", tools=demo_tools(speed=200))
    assert await agent.prompt("count words: Hello   Agent") == "completed"
    data = await store.load("t1")
    assert data is not None
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert result.tool_name == "count_words" and result.text == "words=2" and not result.is_error
    (record,) = await store.list_steps("t1")
    assert record.key == job_key("count_words", {"text": "Hello   Agent"})
    assert (record.workflow, record.next_step, record.total_steps, record.revision, record.data) == (
        COUNT_WORDS_WORKFLOW,
        2,
        2,
        2,
        "words=2",
    )
    # Running the tool again under the same key changes nothing.
    tools = {t.name: t for t in demo_tools(speed=200)}
    ctx = ToolContext(
        "again",
        asyncio.Event(),
        lambda p, t: None,
        record.key,
        steps=StepLog(store, "t1", record.key, {"text": "Hello   Agent"}),
    )
    again = await tools["count_words"].invoke(ctx, tools["count_words"].parameters(text="Hello   Agent"))
    assert again.content == "words=2"
    assert await store.step_get("t1", record.key) == record


async def test_a_demo_tool_resumed_after_a_crash_continues_after_its_last_committed_shard() -> None:
    store = MemoryCheckpointer(OWNER)
    call = faux_tool_call("fetch_dataset", {"name": "sales", "rows": 10, "request": 1}, id="call_fetch")
    provider = FauxProvider([faux_reply("Fetching.", call)])
    first = Agent(provider, store, "t1", tools=demo_tools(speed=20))
    key = job_key("fetch_dataset", {"name": "sales", "rows": 10, "request": 1})
    committed = asyncio.Event()

    async def watch() -> None:
        while (record := await store.step_get("t1", key)) is None or record.next_step < 3:
            await asyncio.sleep(0.005)
        committed.set()

    watcher = asyncio.create_task(watch())
    run = asyncio.create_task(first.prompt("fetch the sales data"))
    await asyncio.wait_for(committed.wait(), WAIT)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await watcher
    record = await store.step_get("t1", key)
    assert record is not None and 3 <= record.next_step < 8

    resumer = Agent(FauxProvider([faux_reply("Fetched.")]), store, "t1", tools=demo_tools(speed=20))
    shown: list[str] = []
    resumer.subscribe(lambda e: shown.append(e.text) if isinstance(e, ToolExecutionUpdate) and e.text else None)
    assert await resumer.resume() == "completed"
    assert shown and shown[0] == f"downloading shard {record.next_step + 1}/8"  # not shard 1 again
    done = await store.step_get("t1", key)
    assert done is not None and (done.next_step, done.revision) == (8, 8)
    (result,) = [m for m in (await store.load("t1")).messages if isinstance(m, ToolResultMessage)]  # type: ignore[union-attr]
    assert result.text.startswith("Fetched 10 rows of 'sales' in 8 shards")
