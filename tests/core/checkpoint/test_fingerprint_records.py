"""The thread record's fingerprints JSON, written and read by one pair of functions in
``core/checkpoint/base.py`` for SQLite, Postgres and Redis.

``MAIN_*`` are the exact texts each backend stored before those functions existed (its own
encoder, captured by writing the :func:`recorded` sequence below with that code to a real
file, database and key prefix and reading the raw values back). The stores must still write
those bytes, so databases written by either version read the same in the other; and an
unreadable record must read the same on every backend: one sentence from ``load_meta``, a
problem shown raw by ``load`` while the rest of the thread still loads.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.base import (
    RECORD_ROW,
    FingerprintOverride,
    Fingerprints,
    encode_fingerprints,
    encode_override,
    encode_overrides,
)
from core.errors import CorruptRecordError
from core.messages import user_text
from core.owners import OWNER_ENV
from tests.helpers.store_backends import BACKEND_PARAMS, new_location
from tests.helpers.store_locations import open_location, split_redis_location

FULL = Fingerprints(
    input="a" * 64,
    agent="b" * 64,
    parts={"model": "modèle-ü", "system_prompt": "c" * 64, "tool:read": "d" * 64},
    workflow="v1 “quoted”",
)
BARE = Fingerprints(input=None, agent="e" * 64, parts={}, workflow=None)
FIRST = FingerprintOverride(at=1700000000.25, owner="alice", changes=("model", "tool:read"))
SECOND = FingerprintOverride(at=1700000100.5, owner="alice", changes=("workflow",))

_PARTS = '"model":"mod\\u00e8le-\\u00fc","system_prompt":"' + "c" * 64 + '","tool:read":"' + "d" * 64 + '"'
MAIN_FULL_COMPACT = (
    '{"input":"'
    + "a" * 64
    + '","agent":"'
    + "b" * 64
    + '","parts":{'
    + _PARTS
    + '},"workflow":"v1 \\u201cquoted\\u201d"}'
)
MAIN_FULL_SPACED = (
    '{"input": "'
    + "a" * 64
    + '", "agent": "'
    + "b" * 64
    + '", "parts": {'
    + _PARTS.replace('","', '", "').replace('":"', '": "')
    + '}, "workflow": "v1 \\u201cquoted\\u201d"}'
)
MAIN_BARE_COMPACT = '{"input":null,"agent":"' + "e" * 64 + '","parts":{},"workflow":null}'
MAIN_BARE_SPACED = '{"input": null, "agent": "' + "e" * 64 + '", "parts": {}, "workflow": null}'
MAIN_OVERRIDES_COMPACT = (
    '[{"at":1700000000.25,"owner":"alice","changes":["model","tool:read"]},'
    '{"at":1700000100.5,"owner":"alice","changes":["workflow"]}]'
)
MAIN_OVERRIDES_SPACED = (
    '[{"at": 1700000000.25, "owner": "alice", "changes": ["model", "tool:read"]},'
    ' {"at": 1700000100.5, "owner": "alice", "changes": ["workflow"]}]'
)

MAIN_STORED: dict[str, dict[str, tuple[str, str | None]]] = {
    # (fingerprints, overrides) of threads "t1" and "t2" after recorded(); Redis keeps no
    # overrides field before the first override.
    "sqlite": {"t1": (MAIN_FULL_COMPACT, MAIN_OVERRIDES_COMPACT), "t2": (MAIN_BARE_COMPACT, "[]")},
    "postgres": {"t1": (MAIN_FULL_SPACED, MAIN_OVERRIDES_SPACED), "t2": (MAIN_BARE_SPACED, "[]")},
    "redis": {"t1": (MAIN_FULL_COMPACT, MAIN_OVERRIDES_COMPACT), "t2": (MAIN_BARE_COMPACT, None)},
}

PARTS = ("fingerprints", "overrides")

SENTENCE = "The fingerprints record of thread 't1' cannot be read; it was left as it is."


@pytest.fixture(autouse=True)
def _alice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every store here is opened for owner "alice", the owner of the overrides."""
    monkeypatch.setenv(OWNER_ENV, "alice")


@asynccontextmanager
async def recorded(location: str) -> AsyncIterator[Any]:
    """A store created at ``location`` with two threads written ("t1": three fingerprint
    writes and two overrides, "t2": one write), the sequence whose stored texts ``MAIN_STORED``
    holds; closed after."""
    store = await open_location(location, create=True)
    try:
        await store.append("t1", [user_text("hi")])
        meta = await store.save_fingerprints("t1", BARE, expected_revision=0)
        meta = await store.save_fingerprints("t1", BARE, expected_revision=meta.revision, override=FIRST)
        await store.save_fingerprints("t1", FULL, expected_revision=meta.revision, override=SECOND)
        await store.append("t2", [user_text("hi")])
        await store.save_fingerprints("t2", BARE, expected_revision=0)
        yield store
    finally:
        await store.close()


_COLUMNS = {
    "sqlite": ("cubepi_thread_records", "fingerprints_json", "overrides_json"),
    "postgres": ("cubepi_tui_thread_records", "fingerprints", "overrides"),
    "redis": ("tui:rec:", "fp", "ovr"),
}
"""Where each backend keeps a thread's record: table (Redis: key prefix), fingerprints, overrides."""


async def raw_record(location: str, backend: str, thread_id: str, set_part: tuple[int, str] | None = None) -> list[Any]:
    """The stored ``[fingerprints, overrides]`` texts of ``thread_id``, read past the store;
    with ``set_part`` = ``(0 or 1, text)`` that part is first overwritten with ``text``."""
    table, *columns = _COLUMNS[backend]
    if backend == "sqlite":
        with sqlite3.connect(location) as c:
            if set_part is not None:
                c.execute(
                    f"UPDATE {table} SET {columns[set_part[0]]} = ? WHERE thread_id = ?", (set_part[1], thread_id)
                )
            return list(
                c.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE thread_id = ?", (thread_id,)).fetchone()
            )
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(location)
        try:
            if set_part is not None:
                await conn.execute(
                    f"UPDATE {table} SET {columns[set_part[0]]} = $1 WHERE thread_id = $2", set_part[1], thread_id
                )
            return list(
                await conn.fetchrow(f"SELECT {', '.join(columns)} FROM {table} WHERE thread_id = $1", thread_id)
            )
        finally:
            await conn.close()
    import redis.asyncio as aioredis

    url, prefix = split_redis_location(location)
    client = aioredis.from_url(url, socket_timeout=10)
    key = f"{prefix}{table}{thread_id}"
    try:
        if set_part is not None:
            await client.hset(key, columns[set_part[0]], set_part[1])
        return [None if raw is None else raw.decode() for raw in await client.hmget(key, columns)]
    finally:
        await client.aclose()


def test_the_encoders_write_the_texts_the_backends_wrote_before() -> None:
    assert encode_fingerprints(FULL) == MAIN_FULL_COMPACT
    assert encode_fingerprints(FULL, spaced=True) == MAIN_FULL_SPACED
    assert encode_fingerprints(BARE) == MAIN_BARE_COMPACT
    assert encode_fingerprints(BARE, spaced=True) == MAIN_BARE_SPACED
    assert encode_overrides([FIRST, SECOND]) == MAIN_OVERRIDES_COMPACT
    assert encode_overrides([FIRST, SECOND], spaced=True) == MAIN_OVERRIDES_SPACED
    assert encode_overrides([]) == encode_overrides([], spaced=True) == "[]"
    assert "[" + encode_override(FIRST) + "," + encode_override(SECOND) + "]" == MAIN_OVERRIDES_COMPACT


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
async def test_stored_fingerprints_are_the_bytes_the_earlier_code_wrote_and_read_back(
    backend: str, tmp_path: Path
) -> None:
    async with new_location(backend, tmp_path, "fprec") as location:
        async with recorded(location):
            pass
        for thread_id, stored in MAIN_STORED[backend].items():
            assert await raw_record(location, backend, thread_id) == list(stored)
        store = await open_location(location, create=False)  # a new store object reads those bytes
        try:
            for thread_id, (fingerprints, overrides, revision) in {
                "t1": (FULL, (FIRST, SECOND), 3),
                "t2": (BARE, (), 1),
            }.items():
                meta = await store.load_meta(thread_id)
                assert meta is not None
                assert (meta.owner, meta.revision, meta.fingerprints, meta.overrides) == (
                    "alice",
                    revision,
                    fingerprints,
                    overrides,
                )
                data = await store.load(thread_id)
                assert data is not None and data.meta == meta and data.problems == []
        finally:
            await store.close()


@pytest.mark.parametrize(
    ("part", "text"),
    [
        pytest.param("fingerprints", '{"input": 1', id="fingerprints-not-json"),
        pytest.param("fingerprints", '{"agent": "x", "parts": {}}', id="fingerprints-without-input"),
        pytest.param("overrides", '[{"at": "soon"}]', id="overrides-not-ours"),
    ],
)
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
async def test_an_unreadable_fingerprints_record_is_one_sentence_and_a_problem_shown_raw(
    backend: str, part: str, text: str, tmp_path: Path
) -> None:
    async with new_location(backend, tmp_path, "fpbad") as location:
        async with recorded(location) as store:
            await raw_record(location, backend, "t1", set_part=(PARTS.index(part), text))
            with pytest.raises(CorruptRecordError) as bad:
                await store.load_meta("t1")
            assert str(bad.value) == SENTENCE
            assert (bad.value.thread_id, bad.value.row_id) == ("t1", RECORD_ROW)
            data = await store.load("t1")  # the thread still loads; the record is a problem shown raw
            assert data is not None and [m.text for m in data.messages] == ["hi"]  # type: ignore[union-attr]
            assert data.meta is None
            assert [(p.row_id, p.reason, p.raw) for p in data.problems] == [(RECORD_ROW, SENTENCE, text)]
            assert {s.thread_id for s in await store.list_threads()} == {"t1", "t2"}  # the picker still lists it
            other = await store.load_meta("t2")  # another thread's record is untouched by it
            assert other is not None and other.fingerprints == BARE
        assert (await raw_record(location, backend, "t1"))[PARTS.index(part)] == text  # left as it is
