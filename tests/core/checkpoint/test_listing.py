"""The thread listing on every backend: thread versions and summaries of named threads
(``ThreadVersions``), a cost that does not grow with messages per thread, and the first
prompt read without decoding its row (``core.checkpoint.listing.prompt_text``).

Each contract test takes the parametrized ``checkpointer`` fixture (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint import codec
from core.checkpoint.base import Checkpointer, Fingerprints, Lease
from core.checkpoint.capabilities import ListingVersions, ThreadVersions, supports
from core.checkpoint.listing import FIRST_PROMPT_CHARS, prompt_line, prompt_text, stored_prompt_text
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import CorruptRecordError
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage, user_text
from core.owners import UNOWNED
from tests.helpers.decodes import counting_decodes

REQUEST = json.dumps({"question_id": "q1", "thread_id": "t", "payload": {"kind": "confirm", "prompt": "Ship it?"}})


def turns(n: int, start: int = 0) -> list[AnyMessage]:
    """``n`` messages cycling prompt -> reply with a tool call -> tool result (from turn ``start``)."""
    out: list[AnyMessage] = []
    for i in range(start, start + n):
        kind = i % 3
        if kind == 0:
            out.append(user_text(f"step {i}"))
        elif kind == 1:
            call = ToolCall(id=f"c{i}", name="read", arguments={"path": f"f{i}"})
            out.append(AssistantMessage(content=[TextContent(text=f"reading {i}"), call], stop_reason="tool_use"))
        else:
            out.append(ToolResultMessage(tool_call_id=f"c{i - 1}", content=[TextContent(text=f"line {i}\n" * 5)]))
    return out


def as_versions(store: Checkpointer) -> ThreadVersions:
    assert supports(store, ThreadVersions), f"{type(store).__name__} does not declare ThreadVersions"
    return store


# --- ThreadVersions: the contract ---------------------------------------------------------------


async def test_versions_name_exactly_the_listed_threads(checkpointer: Checkpointer) -> None:
    store = as_versions(checkpointer)
    assert await store.thread_versions() == {}
    await checkpointer.append("talked", [user_text("hi"), AssistantMessage(content=[TextContent(text="yo")])])
    await checkpointer.claim_run("claimed", "r1")
    await checkpointer.save_extra("noted", {"title": "x"})
    now = 1e10  # a lease alone (its record, nothing listed) is not a listed thread
    await checkpointer.acquire_lease(Lease("leased", "h", 1, "box", None, now, now, now + 60), is_stale=lambda _: True)  # type: ignore[attr-defined]
    listed = await checkpointer.list_threads()
    assert set(await store.thread_versions()) == {s.thread_id for s in listed} == {"talked", "claimed", "noted"}


async def test_summaries_are_the_listing_of_those_threads(checkpointer: Checkpointer, reopen: Any) -> None:
    store = as_versions(checkpointer)
    for i, tid in enumerate(("a", "b", "c", "d")):
        await checkpointer.append(tid, turns(4 + i))
    bob = await reopen("bob")
    await bob.append("bobs", [user_text("mine")])
    listed = await checkpointer.list_threads()
    picked = await store.summaries(["c", "a", "nobody", "bobs", "a"])
    assert picked == [s for s in listed if s.thread_id in {"a", "c"}], "the listing's summaries, in its order"
    assert await store.summaries([]) == []
    assert "bobs" not in await store.thread_versions() and set(await as_versions(bob).thread_versions()) == {"bobs"}


async def test_a_version_moves_on_every_write_that_changes_a_summary(checkpointer: Checkpointer) -> None:
    store = as_versions(checkpointer)
    await checkpointer.append("t", [user_text("go")])
    await checkpointer.append("other", [user_text("bystander")])
    now = 1e10
    lease = Lease("t", "holder", 1, "box", "r1", now, now, now + 60)
    writes: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("append", lambda: checkpointer.append("t", [AssistantMessage(content=[TextContent(text="ok")])])),
        ("claim_run", lambda: checkpointer.claim_run("t", "r1")),
        ("mark_run_complete", lambda: checkpointer.mark_run_complete("t", "r1")),
        ("acquire_lease", lambda: checkpointer.acquire_lease(lease, is_stale=lambda _: True)),  # type: ignore[attr-defined]
        ("renew_lease", lambda: checkpointer.renew_lease("t", "holder", now + 5, now + 65)),  # type: ignore[attr-defined]
        ("release_lease", lambda: checkpointer.release_lease("t", "holder")),  # type: ignore[attr-defined]
        ("set the pending request", lambda: checkpointer.save_pending_request("t", REQUEST, run_id="r1")),  # type: ignore[attr-defined]
        ("clear the pending request", lambda: checkpointer.save_pending_request("t", None)),  # type: ignore[attr-defined]
        ("save_extra", lambda: checkpointer.save_extra("t", {"k": 1})),
        (
            "save_fingerprints",
            lambda: checkpointer.save_fingerprints("t", Fingerprints("i", "a", {}), expected_revision=0),  # type: ignore[attr-defined]
        ),
    ]
    for name, write in writes:
        before = await store.thread_versions()
        await write()
        after = await store.thread_versions()
        assert after["t"] != before["t"], f"{name} did not move the thread's version"
        assert after["other"] == before["other"], f"{name} moved another thread's version"
    assert await store.thread_versions() == after, "a version does not move without a write"


async def test_a_deleted_thread_has_no_version(checkpointer: Checkpointer) -> None:
    store = as_versions(checkpointer)
    await checkpointer.append("t", [user_text("go")])
    await checkpointer.append("kept", [user_text("stay")])
    await checkpointer.delete_thread("t")  # type: ignore[attr-defined]
    assert set(await store.thread_versions()) == {"kept"} and await store.summaries(["t"]) == []


async def test_the_listing_with_its_versions_is_both_reads_at_once(checkpointer: Checkpointer) -> None:
    if not supports(checkpointer, ListingVersions):
        pytest.skip(f"{type(checkpointer).__name__} reads its listing and versions apart (core.follow reads both)")
    store: ListingVersions = checkpointer
    assert await store.list_threads_and_versions() == ([], {})
    await checkpointer.append("talked", [user_text("hi"), AssistantMessage(content=[TextContent(text="yo")])])
    await checkpointer.append("asked", [user_text("ship?")])
    await checkpointer.save_pending_request("asked", REQUEST, run_id="r1")  # type: ignore[attr-defined]
    await checkpointer.claim_run("claimed", "r1")
    await checkpointer.save_extra("noted", {"title": "x"})
    now = 1e10
    lease = Lease("talked", "h", 1, "box", None, now, now, now + 60)
    await checkpointer.acquire_lease(lease, is_stale=lambda _: True)  # type: ignore[attr-defined]
    listed, versions = await store.list_threads_and_versions()
    assert listed == await checkpointer.list_threads() and versions == await store.thread_versions()
    assert set(versions) == {s.thread_id for s in listed} == {"talked", "asked", "claimed", "noted"}
    await checkpointer.append("asked", [AssistantMessage(content=[TextContent(text="shipped")])])
    after = await store.thread_versions()
    assert after["asked"] != versions["asked"] and after["talked"] == versions["talked"]


# --- the cost: rows decoded, not time ------------------------------------------------------------


async def test_the_listing_decodes_no_more_rows_for_longer_threads(checkpointer: Checkpointer) -> None:
    """Rows decoded (or, in memory, copied) by one listing of 12 threads of 10 messages,
    then of the same threads grown to 100: each thread's tail is its last reply and the two
    rows after it either way, so the work must not grow (at most 2x, the standard's bound)."""
    threads = [f"t{i:02d}" for i in range(12)]
    for tid in threads:
        await checkpointer.append(tid, turns(10))
    with counting_decodes() as short:
        listed = await checkpointer.list_threads()
    assert all(len(s.tail) == 3 and s.message_count == 10 for s in listed)
    for tid in threads:
        await checkpointer.append(tid, turns(90, start=10))
    with counting_decodes() as long:
        listed = await checkpointer.list_threads()
    assert all(len(s.tail) == 3 and s.message_count == 100 for s in listed)
    assert short.rows >= len(threads) * 3, "the count saw the tails"
    assert long.rows <= 2 * short.rows, f"{short.rows} rows at 10 messages a thread, {long.rows} at 100"


async def test_summaries_of_a_few_threads_decode_only_theirs(checkpointer: Checkpointer) -> None:
    store = as_versions(checkpointer)
    for i in range(30):
        await checkpointer.append(f"t{i:02d}", turns(10))
    with counting_decodes() as whole:
        await checkpointer.list_threads()
    with counting_decodes() as two:
        assert [s.thread_id for s in await store.summaries(["t03", "t07"])] == ["t07", "t03"]
    assert 0 < two.rows * 10 <= whole.rows


# --- the first prompt without decoding its row ---------------------------------------------------

# (JSON text of a user row, what the rule should do with it: "text" = it must answer, "unsure" = it may not)
PROMPT_ROWS: list[tuple[str, str]] = [
    ('{"role": "user", "content": "plain text"}', "text"),
    ('{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}', "text"),
    (
        '{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "data": "AAAA",'
        ' "mime_type": "image/png"}, {"type": "text", "text": "this"}]}',
        "text",
    ),
    ('{"role": "user", "content": [{"type": "image", "source": "AAAA", "media_type": "image/png"}]}', "text"),
    ('{"role": "user", "content": [{"type": "image", "source": {"url": "x"}}, {"type": "text", "text": "u"}]}', "text"),
    ('{"role": "user", "content": [{"type": "video", "url": "x"}, {"type": "text", "text": "after"}]}', "text"),
    (
        '{"role": "user", "content": [{"type": "thinking", "thinking": "hm", "signature": null}, {"type": "text", "text": "t"}]}',
        "text",
    ),
    (
        '{"role": "user", "content": [{"type": "tool_call", "id": "c", "name": "n", "arguments": {}}, {"type": "text", "text": "x"}]}',
        "text",
    ),
    ('{"role": "user", "content": [{"type": "tool_call", "id": "c"}]}', "unsure"),
    ('{"role": "user", "content": [{"type": "tool_call", "id": "c", "name": "n", "arguments": "x"}]}', "unsure"),
    ('{"role": "user", "content": [{"type": "text", "text": 5}]}', "unsure"),
    ('{"role": "user", "content": [{"type": "text"}, {"type": "text", "text": "second"}]}', "text"),
    ('{"role": "user"}', "text"),
    ('{"role": "user", "content": null}', "unsure"),
    ('{"role": "user", "content": 5}', "unsure"),
    ('{"role": "user", "content": "t", "timestamp": "12"}', "unsure"),
    ('{"role": "user", "content": "t", "timestamp": true}', "unsure"),
    (
        '{"role": "user", "content": "t", "timestamp": null, "metadata": {}, "run_id": null, "id": "x", "foo": [1]}',
        "text",
    ),
    ('{"role": "user", "content": "t", "timestamp": 12, "metadata": {"kind": "steer"}, "run_id": "r"}', "text"),
    ('{"role": "user", "content": "t", "metadata": null}', "unsure"),
    ('{"role": "user", "content": "t", "run_id": 7}', "unsure"),
    ('{"role": "user", "content": ["hello"]}', "unsure"),
    ('{"role": "user", "content": [{"text": "no type"}]}', "unsure"),
    ('{"role": "user", "content": [{"type": 5}]}', "unsure"),
    ('{"role": "user", "content": [{"type": "image", "data": 5}]}', "unsure"),
    ('{"role": "user", "content": [{"type": "text", "text": "a\\udcffb"}]}', "text"),
    ('{"role": "user", "content": [{"type": "text", "text": "smile \\ud83d\\ude00"}]}', "text"),
    ('{"role": "user", "content": [{"type": "text", "text": "  lots\\n\\n of   space  "}]}', "text"),
    ('{"role": "user", "content": "' + "long words " * 60 + '"}', "text"),
    ('{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}], "id": ""}', "text"),
]


def decoded_text(raw: str) -> str | None:
    """What decoding gives: the user message's text, ``None`` when the row does not decode as one."""
    try:
        message = codec.decode(raw)
    except CorruptRecordError:
        return None
    return message.text if isinstance(message, UserMessage) else None


@pytest.mark.parametrize(("raw", "kind"), PROMPT_ROWS)
def test_the_prompt_rule_answers_only_what_decoding_gives(raw: str, kind: str) -> None:
    text = prompt_text(json.loads(raw))
    if kind == "text":
        assert text is not None, "the rule should read this row without decoding it"
    if text is not None:
        assert text == decoded_text(raw)


# Rows where parsers differ (besides PROMPT_ROWS): duplicate keys (the decoder's parser keeps
# the last), NaN, nesting deeper than the decoder's parser reads, a pair of surrogate escapes.
PARSER_ROWS: list[tuple[str, str]] = [
    ('{"role": "user", "content": "first", "content": "second"}', "text"),
    ('{"role": "assistant", "role": "user", "content": "was a reply"}', "text"),
    ('{"role": "user", "role": "assistant", "content": []}', "unsure"),
    ('{"role": "user", "content": "t", "timestamp": NaN}', "text"),
    ('{"role": "user", "content": "t", "metadata": {"deep": ' + "[" * 300 + "]" * 300 + "}}", "unsure"),
    ('{"role": "user", "content": "t", "metadata": {"deep": ' + "[" * 100 + "]" * 100 + "}}", "text"),
    ('{"role": "user", "content": [{"type": "text", "text": "a\\udcff \\ud83d\\ude00"}]}', "text"),
    ('{"role": "user", "content": "t"', "unsure"),
]


@pytest.mark.parametrize(("raw", "kind"), PROMPT_ROWS + PARSER_ROWS)
def test_the_stored_prompt_is_what_decoding_gives(raw: str, kind: str) -> None:
    """``stored_prompt_text`` parses a row as the decoder does: it answers the rows the rule
    vouches for, and only with the decoded text (``None`` for a row that does not decode)."""
    text = stored_prompt_text(raw.encode("utf-8", "surrogatepass"))
    if kind == "text":
        assert text is not None, "the rule should read this row without decoding it"
    if text is not None:
        assert text == decoded_text(raw)


def test_the_prompt_line_is_collapsed_and_cut() -> None:
    assert prompt_line("  a\n\n b\tc ") == "a b c"
    cut = prompt_line("word " * 100)
    assert len(cut) == FIRST_PROMPT_CHARS and cut.endswith("…") and cut.startswith("word word")


async def test_sqlite_reads_the_first_prompt_under_the_same_rule(tmp_path: Path) -> None:
    """Each row of PROMPT_ROWS as the first row of a thread, a reply after it (so the tail
    does not hold it): the listing's first prompt is what decoding gives, and the rows it
    decodes are the tails plus exactly the rows the rule cannot vouch for."""
    path = tmp_path / "prompts.sqlite"
    await (await SQLiteCheckpointer.open(path, create=True)).close()
    reply = codec.encode(AssistantMessage(content=[TextContent(text="ok")]))
    db = sqlite3.connect(path, isolation_level=None)
    for i, (raw, _) in enumerate(PROMPT_ROWS):  # as cubeloop writes: rows of a thread without our record
        db.executemany(
            "INSERT INTO messages (thread_id, message_json) VALUES (?, ?)", [(f"p{i:02d}", raw), (f"p{i:02d}", reply)]
        )
    db.close()
    unsure = sum(prompt_text(json.loads(raw)) is None for raw, _ in PROMPT_ROWS)
    async with await SQLiteCheckpointer.open(path, create=False, owner=UNOWNED) as store:
        with counting_decodes() as count:
            by_id = {s.thread_id: s for s in await store.list_threads()}
    for i, (raw, _) in enumerate(PROMPT_ROWS):
        expected = decoded_text(raw)
        assert by_id[f"p{i:02d}"].first_prompt == ("" if expected is None else prompt_line(expected)), raw
    assert count.rows == len(PROMPT_ROWS) + unsure


# --- a stored assistant row that does not decode ---------------------------------------------


async def test_sqlite_tail_reaches_back_past_an_undecodable_reply(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    async with await SQLiteCheckpointer.open(path, create=True) as store:
        await store.append("t", [user_text("go"), AssistantMessage(content=[TextContent(text="first reply")])])
        db = sqlite3.connect(path, isolation_level=None)
        db.execute(
            """INSERT INTO messages (thread_id, message_json) VALUES ('t', '{"role": "assistant", "content": 5}')"""
        )
        db.close()
        await store.append("t", [user_text("and?")])
        (summary,) = await store.list_threads()
    assert [m.role for m in summary.tail] == ["assistant", "user"] and summary.tail[0].text == "first reply"  # type: ignore[union-attr]
    assert [p.row_id for p in summary.problems] == [3]


# --- versions for every writer ----------------------------------------------------------------


async def test_sqlite_versions_move_for_rows_another_program_wrote(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    async with await SQLiteCheckpointer.open(path, create=True, owner=UNOWNED) as store:
        await store.append("t", [user_text("go")])
        before = await store.thread_versions()
        db = sqlite3.connect(path, isolation_level=None)
        db.execute(
            """INSERT INTO messages (thread_id, message_json) VALUES ('t', '{"role": "user", "content": "x"}')"""
        )
        db.execute("INSERT INTO runs (thread_id, run_id) VALUES ('t', 'r1')")
        db.execute(
            'INSERT INTO messages (thread_id, message_json) VALUES (\'new\', \'{"role": "user", "content": "y"}\')'
        )
        db.close()
        after = await store.thread_versions()
    assert after["t"] != before["t"] and set(after) == {"t", "new"}


async def test_a_browsed_cubeloop_file_has_a_version_per_listed_thread(fixture_db: Path) -> None:
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        assert store.read_only
        listed = await store.list_threads()
        versions = await store.thread_versions()
        assert set(versions) == {s.thread_id for s in listed} and listed
        assert await store.summaries([s.thread_id for s in listed[:2]]) == listed[:2]


async def test_a_file_without_the_thread_index_lists_as_one_with_it(tmp_path: Path) -> None:
    """cubeloop's file has no index on ``messages(thread_id)``: the listing then reads every
    row once instead of seeking each thread (which would scan the table per thread), with
    the same result as the same rows under the index."""
    from core.checkpoint.sqlite_schema import _CUBELOOP_TABLES

    bare, indexed = tmp_path / "bare.sqlite", tmp_path / "indexed.sqlite"
    threads = {f"t{i}": [codec.encode(m) for m in turns(4 + i)] for i in range(6)}
    for path in (bare, indexed):
        db = sqlite3.connect(path, isolation_level=None)
        for ddl in _CUBELOOP_TABLES:
            db.execute(ddl)
        for tid, rows in threads.items():
            db.executemany("INSERT INTO messages (thread_id, message_json) VALUES (?, ?)", [(tid, r) for r in rows])
        db.execute(
            'INSERT INTO messages (thread_id, message_json) VALUES (\'t2\', \'{"role": "assistant", "content": 5}\')'
        )
        db.execute("INSERT INTO runs (thread_id, run_id, claimed_at) VALUES ('only-run', 'r1', 2460000.5)")
        if path == indexed:
            db.execute("CREATE INDEX ix_messages_thread_id ON messages (thread_id, id)")
        db.execute("UPDATE messages SET created_at = 2460000.5 + id")  # the same times in both files
        db.close()
    listings, versions = [], []
    for path in (bare, indexed):
        async with await SQLiteCheckpointer.open(path, create=False, owner=UNOWNED) as store:
            assert store.read_only
            listings.append(await store.list_threads())
            versions.append(await store.thread_versions())
    assert listings[0] == listings[1] and len(listings[0]) == 7
    assert versions[0] == versions[1]
    assert [m.role for m in {s.thread_id: s for s in listings[0]}["t2"].tail] == ["assistant", "tool_result"]


async def test_sqlite_tails_of_every_shape_are_the_rows_from_the_last_reply(tmp_path: Path) -> None:
    """Threads that begin on a reply, on a tool result or on a prompt, that hold no reply at
    all, or one reply only, list with the same tail with the thread index and without it,
    and that tail is what loading the whole thread gives: its last assistant message and
    every message after it, or every message when it holds none."""
    from core.checkpoint.sqlite_schema import _CUBELOOP_TABLES

    threads = {f"t{start}-{n}": turns(n, start) for start in range(3) for n in range(1, 6)}
    threads["prompts"] = [user_text("one"), user_text("two")]
    threads["results"] = turns(1, 2) + turns(1, 2)
    bare, indexed = tmp_path / "bare.sqlite", tmp_path / "indexed.sqlite"
    for path in (bare, indexed):
        db = sqlite3.connect(path, isolation_level=None)
        for ddl in _CUBELOOP_TABLES:
            db.execute(ddl)
        for tid, messages in threads.items():
            db.executemany(
                "INSERT INTO messages (thread_id, message_json) VALUES (?, ?)",
                [(tid, codec.encode(m)) for m in messages],
            )
        if path == indexed:
            db.execute("CREATE INDEX ix_messages_thread_id ON messages (thread_id, id)")
        db.execute("UPDATE messages SET created_at = 2460000.5 + id")
        db.close()
    listings = []
    for path in (bare, indexed):
        async with await SQLiteCheckpointer.open(path, create=False, owner=UNOWNED) as store:
            listings.append({s.thread_id: s for s in await store.list_threads()})
    assert listings[0] == listings[1]
    for tid, messages in threads.items():
        replies = [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage)]
        expected = messages[replies[-1] :] if replies else messages
        assert [m.model_dump() for m in listings[1][tid].tail] == [m.model_dump() for m in expected], tid
