"""StoreWatch and the follower's stop: a stop that arrives together with a change still stops.

On Python 3.11, ``asyncio.wait_for(event.wait(), t)`` cancelled while the event is being set
returns the event's result instead of raising ``CancelledError``: the cancel is lost. A
``StoreWatch.wait`` built on it kept its caller running, and ``ThreadFollower.stop()``
(cancel, then wait for the task) waited forever - the hang seen in
``tests/tui/test_elsewhere.py`` under load, where the other connection's writes kick the
watch all the time. These tests make that coincidence happen on purpose.
"""

from __future__ import annotations

import asyncio

import pytest

from core.changes import StoreWatch
from core.checkpoint.memory import MemoryCheckpointer
from core.follow import ThreadFollower
from core.messages import user_text


class TokenStore:
    """Just a change token, moved by hand."""

    def __init__(self) -> None:
        self.token = 0

    async def change_token(self) -> int:
        return self.token


async def test_a_wait_cancelled_while_a_change_is_kicked_in_is_cancelled() -> None:
    store = TokenStore()
    for _ in range(20):
        async with StoreWatch(store, signals=False, poll=1.0) as watch:
            task = asyncio.create_task(watch.wait())
            await asyncio.sleep(0.01)  # it waits for a kick now
            assert not task.done()
            store.token += 1
            watch.kick()  # a change arrives...
            task.cancel()  # ...as its owner stops it, in the same turn of the loop
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()


async def test_a_follower_stopped_while_a_change_arrives_stops() -> None:
    store = MemoryCheckpointer()
    await store.append("t", [user_text("hello")])
    for i in range(20):
        follower = ThreadFollower(store, "t", poll=1.0)
        await follower.start()
        await asyncio.sleep(0.01)  # its task waits for a change now
        await store.append("t", [user_text(f"note {i}")])
        assert follower._watch is not None
        follower._watch.kick()  # what the file watch does after a commit
        await asyncio.wait_for(follower.stop(), 5)  # raises TimeoutError where it used to hang
