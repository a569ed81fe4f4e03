"""The contract under concurrency, on every backend: many writers, one thread, nothing lost.

* several real processes appending to one thread keep every message exactly once, each
  writer's messages in its own order, and every load returns the same one order;
* 100 concurrent ``save_extra`` writers, each with its own connection where the backend
  has connections, lose no key (no read-modify-write race).

Memory has no second process, so there the writers are tasks on one store.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.checkpoint.base import Checkpointer
from core.checkpoint.memory import MemoryCheckpointer
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
