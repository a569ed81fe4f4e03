"""The Redis store against CubePi's custom-backend example layout, and its open modes and migrations.

Stores of the example's layout are written here as that example writes them: RPUSH of
cubeloop's own messages' ``model_dump_json()`` and SET of the extra JSON. Their threads
record no owner, so they are read and written with ``owner=UNOWNED`` (the rule since
schema v3; a named owner does not see them, see ``test_redis_owners.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from cubeloop.providers.base import AssistantMessage as CubeAssistant
from cubeloop.providers.base import TextContent as CubeText
from cubeloop.providers.base import ToolCall as CubeCall
from cubeloop.providers.base import ToolResultMessage as CubeResult
from cubeloop.providers.base import UserMessage as CubeUser

from core.checkpoint import redis_schema
from core.checkpoint.redis import RedisCheckpointer
from core.checkpoint.redis_keys import Keys
from core.errors import DatabaseOpenError, ReadOnlyStoreError, SchemaError
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.owners import UNOWNED
from tests.helpers.redis_tools import admin, example_append, example_load, example_save_extra
from tests.helpers.services import redis_prefix

pytestmark = pytest.mark.redis


@pytest.fixture
async def place() -> AsyncIterator[tuple[str, str]]:
    async with redis_prefix("layout") as found:
        yield found


def cubeloop_thread(n: int) -> list[object]:
    return [
        CubeUser(content=[CubeText(text=f"question {n}")], timestamp=1000.0 + n, run_id="r1"),
        CubeAssistant(
            content=[CubeText(text="reading"), CubeCall(id=f"c{n}", name="read", arguments={"path": "a"})],
            stop_reason="tool_use",
            tokens_in=12,
            timestamp=1001.0 + n,
            run_id="r1",
        ),
        CubeResult(tool_call_id=f"c{n}", tool_name="read", content=[CubeText(text="ok")], timestamp=1002.0 + n),
    ]


async def write_example_store(url: str, prefix: str) -> None:
    async with admin(url) as client:
        for n in range(3):
            await example_append(client, prefix, f"t{n}", cubeloop_thread(n))
        await example_save_extra(client, prefix, "t0", {"title": "first", "big": 2**60})
        await example_save_extra(client, prefix, "only-extra", {"note": "no messages"})


async def test_a_store_of_the_example_layout_opens_browse_only_and_reads_right(place: tuple[str, str]) -> None:
    url, prefix = place
    await write_example_store(url, prefix)
    async with admin(url) as client:
        before = {k: await client.dump(k) for k in await client.keys(prefix + "*")}
    async with await RedisCheckpointer.open(url, prefix=prefix, owner=UNOWNED) as store:
        assert (store.needs_upgrade, store.read_only, store.schema_version) == (True, True, None)
        data = await store.load("t0")
        assert data is not None and data.problems == []
        assert [m.role for m in data.messages] == ["user", "assistant", "tool_result"]
        assert data.message_ids == [1, 2, 3]
        assert data.messages[0].text == "question 0" and data.messages[1].tool_calls[0].id == "c0"
        assert data.messages[1].model_dump()["tokens_in"] == 12, "cubeloop's own fields are kept"
        assert data.extra == {"title": "first", "big": 2**60}
        assert data.journal is None and data.runs == []
        assert [m.role for m in (await store.load_after("t0", 1)).messages] == ["assistant", "tool_result"]
        summaries = {s.thread_id: s for s in await store.list_threads()}
        assert set(summaries) == {"t0", "t1", "t2", "only-extra"}
        assert [s.thread_id for s in await store.list_threads()][:3] == ["t2", "t1", "t0"], "by last message time"
        t1 = summaries["t1"]
        assert (t1.message_count, t1.first_prompt, t1.last_activity) == (3, "question 1", 1003.0)
        assert [m.role for m in t1.tail] == ["assistant", "tool_result"] and t1.lease is None
        assert await store.load_journal("t0") is None and await store.get_lease("t0") is None
        assert await store.list_leases() == {} and await store.list_commands("t0") == []
        assert await store.read_live_events("t0") == [] and await store.job_get("t0", "k") is None
        for write in (
            store.append("t0", [user_text("hi")]),
            store.save_extra("t0", {"a": 1}),
            store.claim_run("t0", "r9"),
            store.send_command("t0", "abort"),
            store.record_tool_event("t0", "c1", "start"),
        ):
            with pytest.raises(ReadOnlyStoreError):
                await write
        token = await store.change_token()
        async with admin(url) as client:
            after = {k: await client.dump(k) for k in await client.keys(prefix + "*")}
            assert after == before, "browsing changed nothing"
            await example_append(client, prefix, "t1", [CubeUser(content=[CubeText(text="more")])])
        assert await store.change_token() != token, "the example's own writes change the browse-only token"


async def test_upgrade_adds_our_keys_and_the_example_still_reads_everything(place: tuple[str, str]) -> None:
    url, prefix = place
    await write_example_store(url, prefix)
    async with await RedisCheckpointer.open(url, prefix=prefix, owner=UNOWNED) as store:
        await store.upgrade()
        assert (store.needs_upgrade, store.read_only, store.schema_version) == (
            False,
            False,
            len(redis_schema.MIGRATIONS),
        )
        summaries = {s.thread_id: s for s in await store.list_threads()}
        assert set(summaries) == {"t0", "t1", "t2", "only-extra"}
        assert summaries["t2"].first_prompt == "question 2" and summaries["t2"].last_activity == 1004.0
        assert summaries["only-extra"].last_activity is None, "no message, so no known time"
        await store.claim_run("t0", "r2")
        ours = [
            user_text("from cubepi-tui", run_id="r2"),
            AssistantMessage(
                content=[TextContent(text="calling"), ToolCall(id="k1", name="read", arguments={"p": [1, 2]})],
                stop_reason="tool_use",
                run_id="r2",
            ),
            ToolResultMessage(tool_call_id="k1", tool_name="read", content=[TextContent(text="fine")], run_id="r2"),
        ]
        await store.append("t0", ours)
        await store.save_extra("t0", {"added": []})
        assert (await store.list_threads())[0].thread_id == "t0"
        assert (await store.load("t0")).message_ids == [1, 2, 3, 4, 5, 6]  # type: ignore[union-attr]
    async with admin(url) as client:
        messages, extra = await example_load(client, prefix, "t0")
    assert [type(m).__name__ for m in messages] == ["UserMessage", "AssistantMessage", "ToolResultMessage"] * 2
    assert messages[3].content[0].text == "from cubepi-tui" and messages[4].content[1].arguments == {"p": [1, 2]}
    assert messages[5].tool_call_id == "k1" and messages[3].run_id == "r2"
    assert extra == {"title": "first", "big": 2**60, "added": []}


async def test_an_undecodable_entry_is_reported_and_kept(place: tuple[str, str]) -> None:
    url, prefix = place
    async with await RedisCheckpointer.open(url, prefix=prefix) as store:
        await store.append("t", [user_text("one")])
        async with admin(url) as client:
            await client.rpush(f"{prefix}msgs:t", b"{not json", json.dumps({"role": "user", "content": 5}))
        await store.append("t", [user_text("four")])
        data = await store.load("t")
        assert [m.text for m in data.messages] == ["one", "four"] and data.message_ids == [1, 4]
        assert [(p.row_id, p.raw) for p in data.problems] == [(2, "{not json"), (3, '{"role": "user", "content": 5}')]
        assert "malformed JSON" in data.problems[0].reason
        assert [p.row_id for p in (await store.load_after("t", 2)).problems] == [3]
        (summary,) = await store.list_threads()
        assert summary.message_count == 4
        async with admin(url) as client:
            assert (await client.lrange(f"{prefix}msgs:t", 1, 1)) == [b"{not json"], "left as it was"


async def test_extra_values_round_trip_exactly(place: tuple[str, str]) -> None:
    url, prefix = place
    values = {
        "empty_list": [],
        "empty_object": {},
        "big": 2**60,
        "bigger": -(2**70),
        "tenth": 0.1,
        "float": 1e-310,
        "text": 'naïve ☃ 𝄞 \u0000 "quoted"',
        "nested": [[1, [2, []]], {"a": [{}]}],
        "none": None,
        "flag": False,
    }
    async with await RedisCheckpointer.open(url, prefix=prefix) as store:
        await store.save_extra("t", values)
        await store.save_extra("t", {"later": [[]]})
        data = await store.load("t")
    assert data.extra == {**values, "later": [[]]}
    assert type(data.extra["tenth"]) is float and type(data.extra["big"]) is int


async def test_a_hundred_concurrent_writers_on_separate_connections_lose_no_key(place: tuple[str, str]) -> None:
    url, prefix = place
    stores = [await RedisCheckpointer.open(url, prefix=prefix) for _ in range(4)]
    try:
        await asyncio.gather(
            *(stores[i % 4].save_extra("t", {f"k{i}": [i, {"n": 2**60 + i}], "shared": i}) for i in range(100))
        )
        data = await stores[0].load("t")
    finally:
        for store in stores:
            await store.close()
    assert {k: v for k, v in data.extra.items() if k != "shared"} == {
        f"k{i}": [i, {"n": 2**60 + i}] for i in range(100)
    }
    assert data.extra["shared"] in range(100)
    # The control: the example's own read-modify-write, run the same way, loses keys.
    async with admin(url) as client:
        await asyncio.gather(*(example_save_extra(client, prefix, "plain", {f"k{i}": i}) for i in range(100)))
        assert len(json.loads(await client.get(f"{prefix}extra:plain"))) < 100


async def test_open_modes(place: tuple[str, str]) -> None:
    url, prefix = place
    with pytest.raises(DatabaseOpenError) as nothing:
        await RedisCheckpointer.open(url, prefix=prefix, create=False)
    assert str(nothing.value) == f"There is no agent store at {url} under the prefix {prefix!r}."
    async with await RedisCheckpointer.open(url, prefix=prefix) as created:
        assert (created.read_only, created.schema_version) == (False, len(redis_schema.MIGRATIONS))
    async with await RedisCheckpointer.open(url, prefix=prefix, create=False) as again:
        assert not again.read_only
    async with admin(url) as client:
        await client.set(f"{prefix}tui:schema", 99)
    with pytest.raises(SchemaError) as newer:
        await RedisCheckpointer.open(url, prefix=prefix)
    assert "schema version 99" in str(newer.value) and "update cubepi-tui" in str(newer.value)


async def test_the_prefix_may_come_from_the_url_and_the_password_is_never_shown(place: tuple[str, str]) -> None:
    url, prefix = place
    async with await RedisCheckpointer.open(f"{url}?prefix={prefix}") as store:
        assert store.prefix == prefix and store.where == url
        await store.append("t", [user_text("hi")])
    async with admin(url) as client:
        assert await client.llen(f"{prefix}msgs:t") == 1
    with pytest.raises(DatabaseOpenError) as unreachable:
        await RedisCheckpointer.open("redis://someone:s3cret-pw@127.0.0.1:1/0")
    message = str(unreachable.value)
    assert "s3cret-pw" not in message and "redis://someone@127.0.0.1:1/0" in message
    assert message.count(".") >= 1 and "\n" not in message
    with pytest.raises(DatabaseOpenError) as bad:
        await RedisCheckpointer.open("http://user:s3cret-pw@example.invalid/")
    assert "s3cret-pw" not in str(bad.value)


async def test_an_older_schema_opens_browse_only_and_upgrade_migrates_it(place: tuple[str, str]) -> None:
    url, prefix = place
    async with await RedisCheckpointer.open(url, prefix=prefix, owner=UNOWNED) as store:
        await store.append("a", [AssistantMessage(content=[TextContent(text="no prompt yet")])])
        await store.append("a", [user_text("the first prompt"), user_text("the second")])
        await store.append("b", [user_text("b's prompt")])
    # A v1 store: the same keys but no first-prompt index (v2 added it) and no thread
    # records (v3 added them).
    async with admin(url) as client:
        await client.delete(f"{prefix}tui:first", f"{prefix}tui:rec:a", f"{prefix}tui:rec:b")
        await client.set(f"{prefix}tui:schema", 1)
    async with await RedisCheckpointer.open(url, prefix=prefix, owner=UNOWNED) as old:
        assert (old.needs_upgrade, old.schema_version) == (True, 1)
        by_id = {s.thread_id: s for s in await old.list_threads()}
        assert (by_id["a"].first_prompt, by_id["b"].first_prompt) == ("the first prompt", "b's prompt")
        assert await old.load_journal("a") == {}, "v1 already has our keys"
        with pytest.raises(ReadOnlyStoreError):
            await old.append("a", [user_text("refused")])
        await old.upgrade()
        assert (old.needs_upgrade, old.schema_version) == (False, len(redis_schema.MIGRATIONS))
        await old.append("a", [user_text("accepted")])
    async with admin(url) as client:
        assert await client.hgetall(f"{prefix}tui:first") == {b"a": b"the first prompt", b"b": b"b's prompt"}
        assert await client.get(f"{prefix}tui:schema") == str(len(redis_schema.MIGRATIONS)).encode()
        assert await client.llen(f"{prefix}msgs:a") == 4


async def test_an_upgrade_that_fails_writes_nothing(place: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, prefix = place
    await write_example_store(url, prefix)

    async def broken(_r: object, _keys: object) -> list[tuple[object, ...]]:
        raise RuntimeError("a later step could not read what it needs")

    # The earlier steps' writes are queued only once every step has been prepared.
    monkeypatch.setattr(redis_schema, "MIGRATIONS", [*redis_schema.MIGRATIONS, broken])
    async with await RedisCheckpointer.open(url, prefix=prefix) as store:
        with pytest.raises(RuntimeError):
            await store.upgrade()
        assert store.needs_upgrade
    async with admin(url) as client:
        keys = sorted(k.decode() for k in await client.keys(prefix + "*"))
    assert keys == sorted(f"{prefix}{k}" for k in ("msgs:t0", "msgs:t1", "msgs:t2", "extra:t0", "extra:only-extra"))


async def test_a_store_another_process_creates_while_this_one_opens_opens_writable(
    place: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four appenders opening one fresh prefix at once: one saw no version, then the keys
    another had just written, and took the store for the example's layout (browse-only)."""
    url, prefix = place
    real_anything_under = redis_schema.anything_under
    raced: list[bool] = []

    async def another_process_creates_first(client: object, keys: Keys) -> bool:
        if not raced:
            raced.append(True)
            async with await RedisCheckpointer.open(url, prefix=prefix) as other:
                await other.append("t", [user_text("from the other process")])
        return await real_anything_under(client, keys)  # type: ignore[arg-type]

    monkeypatch.setattr(redis_schema, "anything_under", another_process_creates_first)
    async with await RedisCheckpointer.open(url, prefix=prefix) as store:
        assert raced == [True]
        assert (store.read_only, store.schema_version) == (False, len(redis_schema.MIGRATIONS))
        await store.append("t", [user_text("from this one")])
        assert [m.content[0].text for m in (await store.load("t")).messages] == [
            "from the other process",
            "from this one",
        ]
