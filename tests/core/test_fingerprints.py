"""Fingerprints: a thread records its first input and the agent's definition; a run by another
definition is refused in one sentence naming the change, and goes on with ``accept_changes``
(the override recorded in the thread with its owner and time)."""

from __future__ import annotations

import time

import pytest

from core.agent import Agent
from core.checkpoint.base import Fingerprints
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import FingerprintMismatchError, FirstInputChangedError, NothingToResumeError
from core.fingerprints import (
    FIRST_INPUT_CHANGED,
    agent_fingerprint,
    changes,
    check_workflow,
    definition_parts,
    fingerprints_of,
    first_input_error,
    input_fingerprint,
    mismatch_sentence,
)
from core.messages import AssistantMessage, TextContent, ToolCall, ToolSpec, UserMessage, user_text
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.recovery import JOURNALED_KEY
from core.tools import ToolContext, tool
from tests.helpers.stores import PlainStore

OWNER = "alice"


@tool(idempotent=True)
async def read_file(path: str, ctx: ToolContext) -> str:
    """Read a file."""
    return f"contents of {path}"


@tool(name="read_file", idempotent=True)
async def read_file_v2(path: str, ctx: ToolContext, limit: int = 10) -> str:
    """Read a file (now with a line limit)."""
    return f"first {limit} lines of {path}"


@tool
async def grep(pattern: str) -> str:
    """Search for a pattern."""
    return f"no match for {pattern}"


def replies(n: int = 4) -> FauxProvider:
    return FauxProvider([faux_reply(f"Reply {i}.") for i in range(n)])


def agent(store, provider=None, *, tools=(read_file,), thread="t1", **options) -> Agent:
    return Agent(provider or replies(), store, thread, tools=tools, **options)


async def crashed_mid_tool(store: MemoryCheckpointer, thread: str = "t1") -> None:
    """Leave ``thread`` as a run killed while ``read_file`` ran: a call without its result."""
    await store.claim_run(thread, "run-crashed")
    call = ToolCall(id="call_read", name="read_file", arguments={"path": "README.md"})
    reply = AssistantMessage(
        content=[TextContent(text="Reading."), call],
        stop_reason="tool_use",
        run_id="run-crashed",
        metadata={JOURNALED_KEY: True},
    )
    await store.append(thread, [user_text("read the readme again", run_id="run-crashed"), reply])


# --- the fingerprints themselves ----------------------------------------------------------


def test_input_fingerprint_is_the_same_for_text_a_string_row_and_a_block_row() -> None:
    text = "Hello   Agent"
    assert input_fingerprint(text) == input_fingerprint(UserMessage(content=text))
    assert input_fingerprint(text) == input_fingerprint(user_text(text))
    assert input_fingerprint(text) != input_fingerprint("Hello Agent")
    assert len(input_fingerprint(text)) == 64 and int(input_fingerprint(text), 16) >= 0


def test_definition_parts_name_the_model_the_prompt_and_each_tools_schema() -> None:
    parts = definition_parts("Be brief.", [read_file.spec, grep.spec], "claude-x")
    assert set(parts) == {"model", "system_prompt", "tool:read_file", "tool:grep"}
    assert parts["model"] == "claude-x"
    assert parts["system_prompt"] != "Be brief." and len(parts["system_prompt"]) == 64
    # Only the parameter schema counts: key order and the description do not.
    spec = read_file.spec
    reordered = ToolSpec(
        name=spec.name, description="Another description.", parameters=dict(reversed(list(spec.parameters.items())))
    )
    assert definition_parts("", [reordered], "m")["tool:read_file"] == parts["tool:read_file"]
    assert parts["tool:read_file"] != definition_parts("", [read_file_v2.spec], "m")["tool:read_file"]


def test_changes_name_each_difference_in_words() -> None:
    old_parts = definition_parts("Be brief.", [read_file.spec, grep.spec], "a")
    new_parts = definition_parts("Be thorough.", [read_file_v2.spec], "b")
    old = fingerprints_of(old_parts, "1", "first")
    new = fingerprints_of(new_parts, "2", "another first")
    assert changes(old, new) == (
        FIRST_INPUT_CHANGED,
        "model: a -> b",
        "system prompt changed",
        "tool grep: removed",
        "tool read_file: parameters changed",
        "workflow: 1 -> 2",
    )
    assert changes(new, old)[3] == "tool grep: added"
    assert changes(old, old) == ()
    # A first input is compared only when both sides name one.
    assert changes(old, fingerprints_of(old_parts, "1", None)) == ()
    assert changes(fingerprints_of(old_parts, None, None), fingerprints_of(old_parts, "2", None)) == (
        "workflow: none -> 2",
    )


def test_the_agent_fingerprint_covers_the_parts_and_the_workflow() -> None:
    parts = definition_parts("", [read_file.spec], "m")
    assert agent_fingerprint(parts, "1") == agent_fingerprint(dict(reversed(list(parts.items()))), "1")
    assert agent_fingerprint(parts, "1") != agent_fingerprint(parts, "2")
    assert agent_fingerprint(parts, None) != agent_fingerprint({**parts, "model": "n"}, None)


# --- recording them ---------------------------------------------------------------------


async def test_the_first_prompt_of_a_new_thread_records_its_fingerprints() -> None:
    store = MemoryCheckpointer(OWNER)
    first = agent(store, system_prompt="Be brief.", workflow="1")
    assert await first.prompt("Summarise the README") == "completed"
    meta = await store.load_meta("t1")
    assert meta is not None and meta.owner == OWNER and meta.revision == 1 and meta.overrides == ()
    parts = definition_parts("Be brief.", [read_file.spec], first.provider.model)
    assert meta.fingerprints == Fingerprints(
        input=input_fingerprint("Summarise the README"),
        agent=agent_fingerprint(parts, "1"),
        parts=parts,
        workflow="1",
    )
    assert first.state.meta == meta

    # The same definition goes on and writes no new revision of the record.
    again = agent(store, system_prompt="Be brief.", workflow="1")
    assert await again.prompt("And the changelog") == "completed"
    assert await again.definition_changes() == ()
    assert (await store.load_meta("t1")).revision == 1  # type: ignore[union-attr]


async def test_resume_with_a_changed_tool_schema_is_refused_and_accepted_with_the_override() -> None:
    store = MemoryCheckpointer(OWNER)
    assert await agent(store).prompt("Read the readme") == "completed"
    await crashed_mid_tool(store)
    before = await store.load("t1")
    meta_before = await store.load_meta("t1")

    provider = FauxProvider([faux_reply("Read it again.")])
    changed = agent(store, provider, tools=(read_file_v2,))
    await changed.load()
    assert await changed.definition_changes() == ("tool read_file: parameters changed",)
    with pytest.raises(FingerprintMismatchError) as refused:
        await changed.resume()
    assert refused.value.changes == ("tool read_file: parameters changed",)
    assert str(refused.value) == mismatch_sentence("t1", refused.value.changes)
    assert str(refused.value).startswith(
        "Thread 't1' was written by another definition of the agent: tool read_file: parameters changed. Nothing ran;"
    )
    assert "Nothing ran; run again with --accept-changes (or press a in the app) to go on" in str(refused.value)
    assert "accept_changes" not in str(refused.value)  # the API's parameter is not the user's word
    assert str(refused.value).endswith("and the override is recorded in the thread.")
    # Nothing ran: no model call, no new message or run, the record as it was, no lease left.
    after = await store.load("t1")
    assert provider.requests == [] and not changed.state.ran
    assert after is not None and before is not None
    assert after.messages == before.messages and after.runs == before.runs
    assert await store.load_meta("t1") == meta_before
    assert await store.get_lease("t1") is None

    at = time.time()
    assert await changed.resume(accept_changes=True) == "completed"
    assert changed.state.ran
    meta = await store.load_meta("t1")
    assert meta is not None and meta.revision == meta_before.revision + 1  # type: ignore[union-attr]
    (override,) = meta.overrides
    assert override.owner == OWNER and override.changes == ("tool read_file: parameters changed",)
    assert at <= override.at <= time.time()
    assert meta.fingerprints is not None
    assert meta.fingerprints.parts["tool:read_file"] == definition_parts("", [read_file_v2.spec], "")["tool:read_file"]
    assert meta.fingerprints.input == input_fingerprint("Read the readme")  # the first input stays
    result = [m for m in (await store.load("t1")).messages if m.role == "tool_result"]  # type: ignore[union-attr]
    assert [m.text for m in result] == ["first 10 lines of README.md"]  # the new definition settled it
    # Accepted once: the same definition goes on without another override.
    assert await agent(store, tools=(read_file_v2,)).prompt("Thanks") == "completed"
    assert len((await store.load_meta("t1")).overrides) == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model": "m2"}, "model: m1 -> m2"),
        ({"system_prompt": "Be thorough."}, "system prompt changed"),
        ({"workflow": "2"}, "workflow: 1 -> 2"),
        ({"tools": (read_file, grep)}, "tool grep: added"),
        ({"tools": ()}, "tool read_file: removed"),
    ],
)
async def test_a_new_prompt_by_another_definition_is_refused_naming_the_change(change, words) -> None:
    store = MemoryCheckpointer(OWNER)
    first = agent(store, FauxProvider([faux_reply("Hi.")], model="m1"), system_prompt="Be brief.", workflow="1")
    assert await first.prompt("Hello") == "completed"
    model = change.pop("model", "m1")
    options = {"system_prompt": "Be brief.", "workflow": "1", **change}
    provider = FauxProvider([faux_reply("Again.")], model=model)
    other = agent(store, provider, **options)
    with pytest.raises(FingerprintMismatchError) as refused:
        await other.prompt("Hello again")
    assert refused.value.changes == (words,)
    assert f"another definition of the agent: {words}." in str(refused.value)
    assert len((await store.load("t1")).messages) == 2 and provider.requests == []  # type: ignore[union-attr]
    assert await other.prompt("Hello again", accept_changes=True) == "completed"
    (override,) = (await store.load_meta("t1")).overrides  # type: ignore[union-attr]
    assert override.changes == (words,) and override.owner == OWNER


async def test_a_thread_without_fingerprints_records_them_at_its_next_run_without_refusing() -> None:
    store = MemoryCheckpointer(OWNER)
    # Written the way cubeloop or an older cubepi-tui writes: messages, no fingerprints.
    await store.append("t1", [user_text("Old question"), AssistantMessage(content=[TextContent(text="Old answer.")])])
    meta = await store.load_meta("t1")
    assert meta is None or meta.fingerprints is None
    later = agent(store, workflow="7")
    assert await later.definition_changes() == ()
    assert await later.prompt("A new question") == "completed"
    meta = await store.load_meta("t1")
    assert meta is not None and meta.overrides == ()
    assert meta.fingerprints == fingerprints_of(
        definition_parts("", [read_file.spec], later.provider.model), "7", user_text("Old question")
    )


# --- start: the idempotent "create run with input" -----------------------------------------


async def test_start_runs_a_new_thread_once_and_refuses_another_first_input() -> None:
    store = MemoryCheckpointer(OWNER)
    provider = FauxProvider([faux_reply("Done."), faux_reply("Done with the other.")])
    starter = agent(store, provider)
    assert await starter.start("Count the files") == "completed" and starter.state.ran
    rows = (await store.load("t1")).messages  # type: ignore[union-attr]

    # The same first input again: already done, nothing runs.
    assert await starter.start("Count the files") == "completed"
    assert not starter.state.ran and len(provider.requests) == 1
    assert (await store.load("t1")).messages == rows  # type: ignore[union-attr]

    # A thread id reused with another first input is refused in its own sentence, always:
    # accepting changes covers another definition of the agent, not another job.
    meta = await store.load_meta("t1")
    for accept in (False, True):
        with pytest.raises(FirstInputChangedError) as refused:
            await starter.start("Delete the files", accept_changes=accept)
        assert str(refused.value) == str(first_input_error("t1"))
        assert str(refused.value) == (
            "Thread 't1' was started with another first input; nothing ran: a thread id names one job, "
            "so start this input as another thread (another thread id)."
        )
        assert not starter.state.ran
        assert (await store.load("t1")).messages == rows and len(provider.requests) == 1  # type: ignore[union-attr]
        assert await store.load_meta("t1") == meta  # no override, the first input as it was
        assert await store.get_lease("t1") is None

    # The thread's own first input still finds it done; another thread id takes the new one.
    assert await starter.start("Count the files") == "completed" and not starter.state.ran
    other = agent(store, provider, thread="t2")
    assert await other.start("Delete the files") == "completed" and other.state.ran


async def test_start_with_the_same_first_input_resumes_a_crashed_thread() -> None:
    store = MemoryCheckpointer(OWNER)
    await crashed_mid_tool(store)
    provider = FauxProvider([faux_reply("The readme says hello.")])
    starter = agent(store, provider)
    assert await starter.start("read the readme again") == "completed" and starter.state.ran
    data = await store.load("t1")
    assert data is not None
    assert [m.role for m in data.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert data.messages[2].metadata.get("settled") == "rerun"
    with pytest.raises(NothingToResumeError):
        await starter.resume()
    assert await starter.start("read the readme again") == "completed" and not starter.state.ran


async def test_start_compares_the_first_message_when_the_store_keeps_no_fingerprints() -> None:
    store = PlainStore()
    provider = FauxProvider([faux_reply("Done."), faux_reply("Again.")])
    starter = agent(store, provider)
    assert await starter.start("Build it") == "completed"
    assert await starter.start("Build it") == "completed" and not starter.state.ran
    with pytest.raises(FirstInputChangedError):
        await starter.start("Build something else")
    with pytest.raises(FirstInputChangedError):
        await starter.start("Build something else", accept_changes=True)
    assert [m.text for m in (await store.load("t1")).messages if m.role == "user"] == ["Build it"]  # type: ignore[union-attr]


async def test_a_refused_prompt_with_a_tool_call_pending_runs_no_tool() -> None:
    store = MemoryCheckpointer(OWNER)
    ran: list[str] = []

    @tool(name="read_file", idempotent=True)
    async def counting_read(path: str, ctx: ToolContext, limit: int = 1) -> str:
        """Read a file, counting calls."""
        ran.append(path)
        return "x"

    assert await agent(store).prompt("Read the readme") == "completed"
    await crashed_mid_tool(store)
    provider = FauxProvider([faux_reply("Read.", faux_tool_call("read_file", {"path": "b"})), faux_reply("Ok.")])
    with pytest.raises(FingerprintMismatchError):
        await agent(store, provider, tools=(counting_read,)).prompt("go on")
    assert ran == [] and provider.requests == []


async def test_a_crash_between_recording_the_fingerprints_and_saving_the_first_prompt_is_no_conflict() -> None:
    store = MemoryCheckpointer(OWNER)
    # What a run killed right after recording its fingerprints leaves: a record, no message.
    other = fingerprints_of(definition_parts("Another prompt.", [], "m0"), "0", "An abandoned first prompt")
    await store.save_fingerprints("t1", other, expected_revision=0)
    assert await store.load("t1") is None or not (await store.load("t1")).messages  # type: ignore[union-attr]
    fresh = agent(store, workflow="1")
    assert await fresh.prompt("The real first prompt") == "completed"  # nothing was written by the other one
    meta = await store.load_meta("t1")
    assert meta is not None and meta.revision == 2 and meta.overrides == ()
    assert meta.fingerprints == fingerprints_of(
        definition_parts("", [read_file.spec], fresh.provider.model), "1", "The real first prompt"
    )


@pytest.mark.parametrize(
    ("workflow", "words"),
    [
        ("", "cannot be empty"),
        (" \t", "cannot be empty"),
        ("2\x1b[2J", "holds a control character"),
        ("2\u202e", "holds a control character"),
        ("x" * 201, "at most 200 characters, not 201"),
    ],
)
def test_a_workflow_version_that_cannot_be_shown_is_refused_by_the_agent(workflow: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as refused:
        agent(MemoryCheckpointer(OWNER), workflow=workflow)
    assert str(refused.value).count(".") >= 1 and "\n" not in str(refused.value)
    assert "\x1b" not in str(refused.value) and "\u202e" not in str(refused.value)  # named escaped
    assert check_workflow("count-words/1") == "count-words/1" and check_workflow("x" * 200) == "x" * 200
