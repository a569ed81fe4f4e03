"""The contract under concurrency, on every backend: many writers, one thread, nothing lost.

* several real processes appending to one thread keep every message exactly once, each
  writer's messages in its own order, and every load returns the same one order;
* 100 concurrent ``save_extra`` writers, each with its own connection where the backend
  has connections, lose no key (no read-modify-write race);
* 100 concurrent compare-and-set writers (``save_extra(..., expected_revision=)`` and
  ``step_commit``), on store objects of their own: each applies exactly once or raises
  ``ConflictError``, and the final revision is the number applied.

Memory has no second process, so there the writers are tasks on one store.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.base import Checkpointer
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import ConflictError
from core.messages import UserMessage
from tests.helpers.children import REPO_ROOT
from tests.helpers.store_backends import BACKEND_PARAMS, new_location
from tests.helpers.store_locations import open_location

PROCESSES = 4
PER_PROCESS = 60
BATCH = 3
EXTRA_WRITERS = 100
CHILD_TIMEOUT = 120.0
"""Seconds the appending children may take in all (a liveness bound, not a speed check)."""


@pytest.fixture(params=[pytest.param("memory", id="memory"), *BACKEND_PARAMS])
async def location(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A new store's location (``"memory"`` for the in-process store), created empty."""
    if request.param == "memory":
        yield "memory"
        return
    async with new_location(request.param, tmp_path, "conc") as where:
        store = await open_location(where, create=True)
        await store.close()
        yield where


async def _opener(location: str, memory: MemoryCheckpointer) -> Checkpointer:
    return memory if location == "memory" else await open_location(location, create=False)


def _check_one_order(texts: list[str], tags: list[str], per_tag: int) -> None:
    assert sorted(texts) == sorted(f"{tag}:{i}" for tag in tags for i in range(per_tag)), "lost or doubled messages"
    for tag in tags:
        mine = [int(t.split(":")[1]) for t in texts if t.split(":")[0] == tag]
        assert mine == list(range(per_tag)), f"writer {tag}'s messages are out of its order"


async def test_several_writers_append_to_one_thread_exactly_once_in_one_order(location: str) -> None:
    tags = [f"w{i}" for i in range(PROCESSES)]
    memory = MemoryCheckpointer()
    if location == "memory":

        async def write(tag: str) -> None:
            for start in range(0, PER_PROCESS, BATCH):
                await memory.append("shared", [UserMessage(content=f"{tag}:{i}") for i in range(start, start + BATCH)])
                await asyncio.sleep(0)

        await asyncio.gather(*(write(tag) for tag in tags))
    else:
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.helpers.appender_child",
                    location,
                    "shared",
                    tag,
                    str(PER_PROCESS),
                    str(BATCH),
                ],
                cwd=REPO_ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for tag in tags
        ]
        for child in children:
            out, err = await asyncio.to_thread(child.communicate, timeout=CHILD_TIMEOUT)
            assert child.returncode == 0 and out.strip() == "done", err
    store = await _opener(location, memory)
    try:
        first, second = await store.load("shared"), await store.load("shared")
        assert first is not None and second is not None and not first.problems
        texts = [m.text for m in first.messages]  # type: ignore[union-attr]
        _check_one_order(texts, tags, PER_PROCESS)
        assert texts == [m.text for m in second.messages]  # type: ignore[union-attr]
        assert first.message_ids == second.message_ids
        assert all(a < b for a, b in zip(first.message_ids, first.message_ids[1:], strict=False))
        if location != "memory":
            assert set(first.extra) == set(tags)
    finally:
        await store.close()


async def test_a_hundred_concurrent_save_extra_writers_lose_no_key(location: str) -> None:
    memory = MemoryCheckpointer()
    # One connection per writer where the backend has connections, but no more than a
    # server allows a test (Postgres' default limit is 100): 20 stores, 5 writers each.
    stores = [await _opener(location, memory) for _ in range(1 if location == "memory" else 20)]
    try:
        await stores[0].save_extra("t", {"kept": [1, [], {}]})

        async def write(i: int) -> None:
            await stores[i % len(stores)].save_extra("t", {f"k{i}": {"writer": i, "empty": [], "n": 2**60 + i}})

        await asyncio.gather(*(write(i) for i in range(EXTRA_WRITERS)))
        data = await stores[-1].load("t")
        assert data is not None
        assert data.extra == {
            "kept": [1, [], {}],
            **{f"k{i}": {"writer": i, "empty": [], "n": 2**60 + i} for i in range(EXTRA_WRITERS)},
        }
    finally:
        for store in {id(s): s for s in stores}.values():
            await store.close()


CAS_WRITERS = 100
CAS_STORES = 20
"""Store objects the compare-and-set writers share out (5 writers each): see the tests' docstrings."""


async def _race(
    reopen: Any, read: Callable[[Any], Awaitable[Any]], write: Callable[[Any, int, Any], Awaitable[int]]
) -> tuple[dict[int, int], int]:
    """Run :data:`CAS_WRITERS` writers, writer ``i`` on store object ``i % CAS_STORES`` (each
    from ``reopen("alice")``): all start together, each reads once, waits a few random
    milliseconds (seeded by ``CUBEPI_CRASH_SEED`` when set) and writes once with what it read.
    Returns ``{writer: new revision}`` of those applied and how many got ``ConflictError``.

    One call at a time per store object (a gate each), so a Postgres store object, which
    holds a pool, uses one connection: 20 connections in all, beside the fixture's store.
    """
    stores = [await reopen("alice") for _ in range(CAS_STORES)]
    gates = [asyncio.Semaphore(1) for _ in stores]
    rng = random.Random(os.environ.get("CUBEPI_CRASH_SEED", "cas"))
    delays = [rng.uniform(0, 0.005) for _ in range(CAS_WRITERS)]
    start = asyncio.Event()
    applied: dict[int, int] = {}
    conflicts = 0

    async def writer(i: int) -> None:
        nonlocal conflicts
        store, gate = stores[i % CAS_STORES], gates[i % CAS_STORES]
        await start.wait()
        async with gate:
            seen = await read(store)
        await asyncio.sleep(delays[i])
        async with gate:
            try:
                applied[i] = await write(store, i, seen)
            except ConflictError as error:
                assert error.thread_id == "t" and error.expected != error.actual, error
                conflicts += 1

    tasks = [asyncio.ensure_future(writer(i)) for i in range(CAS_WRITERS)]
    start.set()
    await asyncio.gather(*tasks)
    return applied, conflicts


async def test_a_hundred_compare_and_set_extra_writers_apply_once_or_conflict(checkpointer: Any, reopen: Any) -> None:
    """100 writers, 20 store objects x 5 writers (see :func:`_race`): each reads
    ``extra_revision`` and saves its own key with ``expected_revision`` = what it read."""
    assert await checkpointer.save_extra("t", {"seed": 0}) == 1

    async def read(store: Any) -> int:
        return (await store.load("t")).extra_revision

    async def write(store: Any, i: int, revision: int) -> int:
        new = await store.save_extra("t", {f"w{i}": i}, expected_revision=revision)
        assert new == revision + 1
        return new

    applied, conflicts = await _race(reopen, read, write)
    assert len(applied) + conflicts == CAS_WRITERS
    assert applied and conflicts, f"{len(applied)} applied, {conflicts} conflicts: the writers never raced"
    assert sorted(applied.values()) == list(range(2, 2 + len(applied))), "each revision was given exactly once"
    data = await checkpointer.load("t")
    assert data.extra_revision == 1 + len(applied)
    assert data.extra == {"seed": 0, **{f"w{i}": i for i in applied}}


async def test_a_hundred_compare_and_set_step_writers_apply_once_or_conflict(checkpointer: Any, reopen: Any) -> None:
    """100 writers, 20 store objects x 5 writers (see :func:`_race`): each reads the step
    record and commits the next step with its id appended to the data it read."""
    await checkpointer.step_begin("t", "job:race", input_fingerprint="f" * 64, workflow="w1")

    async def read(store: Any) -> Any:
        return await store.step_get("t", "job:race")

    async def write(store: Any, i: int, seen: Any) -> int:
        new = await store.step_commit(
            "t",
            "job:race",
            expected_revision=seen.revision,
            workflow="w1",
            next_step=seen.next_step + 1,
            data=[*(seen.data or []), i],
        )
        assert new.revision == seen.revision + 1
        return new.revision

    applied, conflicts = await _race(reopen, read, write)
    assert len(applied) + conflicts == CAS_WRITERS
    assert applied and conflicts, f"{len(applied)} applied, {conflicts} conflicts: the writers never raced"
    final = await checkpointer.step_get("t", "job:race")
    assert final.revision == final.next_step == len(applied)
    assert final.data == sorted(applied, key=applied.__getitem__), "every applied step, each once, in order"
