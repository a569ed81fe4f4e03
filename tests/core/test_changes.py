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
import logging

import pytest

from core.changes import StoreWatch
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import StoreConnectionError
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


class LostSignalsStore(TokenStore):
    """Its change signals end as a server's do once it stayed away past every reconnect."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50):  # type: ignore[no-untyped-def]
        raise self.error
        yield None


async def _watch_warning(store: LostSignalsStore, caplog: pytest.LogCaptureFixture) -> logging.LogRecord:
    with caplog.at_level(logging.WARNING, logger="core.changes"):
        async with StoreWatch(store, poll=0.05) as watch:
            await watch.wait(timeout=0.2)  # the listener fails meanwhile; the timer goes on
    (record,) = [r for r in caplog.records if r.name == "core.changes"]
    return record


async def test_signals_lost_with_the_server_are_one_line_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ConnectionRefusedError(111, "Connect call failed")
    except ConnectionRefusedError as cause:
        lost = StoreConnectionError("Lost the connection to redis://db:6379/0 and could not get it back in 26 s.")
        lost.__cause__ = cause
    record = await _watch_warning(LostSignalsStore(lost), caplog)
    assert not record.exc_info
    assert record.getMessage() == (
        "cannot watch LostSignalsStore for changes (Lost the connection to redis://db:6379/0 and could not get it"
        " back in 26 s.); checking every 0.1 s instead"
    )


async def test_signals_that_fail_otherwise_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    record = await _watch_warning(LostSignalsStore(KeyError("bug")), caplog)
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
