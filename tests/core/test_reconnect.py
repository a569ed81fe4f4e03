"""The reconnect rule (core.checkpoint.reconnect.with_reconnect): every "reconnecting" told
to a store's ``on_status`` is followed by "back" once any call through it gets through,
even when the call that retried gave up or was cancelled while it waited."""

from __future__ import annotations

import asyncio

import pytest

from core.checkpoint.reconnect import StoreStatus, with_reconnect
from core.errors import StoreConnectionError


def _is_connection_error(error: BaseException) -> bool:
    return isinstance(error, ConnectionResetError)


async def _down() -> None:
    raise ConnectionResetError("reset by peer")


async def _up() -> str:
    return "ok"


async def _through(call, statuses: list[StoreStatus], delays: tuple[float, ...]):  # type: ignore[no-untyped-def]
    return await with_reconnect(
        call,
        what="load",
        where="redis://db:6379/0",
        is_connection_error=_is_connection_error,
        on_status=statuses.append,
        delays=delays,
    )


async def test_a_call_that_gave_up_is_followed_by_back_when_a_later_call_gets_through() -> None:
    statuses: list[StoreStatus] = []
    with pytest.raises(StoreConnectionError):
        await _through(_down, statuses, (0.01, 0.01))
    assert [s.reconnecting for s in statuses] == [True, True]
    assert await _through(_up, statuses, (0.01,)) == "ok"
    assert statuses[-1] == StoreStatus(False)
    assert await _through(_up, statuses, (0.01,)) == "ok"
    assert len(statuses) == 3, "back is said once, not after every call"


async def test_a_call_cancelled_while_it_waited_to_retry_is_followed_by_back() -> None:
    statuses: list[StoreStatus] = []
    waiting = asyncio.ensure_future(_through(_down, statuses, (60.0,)))
    deadline = asyncio.get_running_loop().time() + 30
    while not statuses:
        assert asyncio.get_running_loop().time() < deadline, "the call never reported its retry"
        await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await _through(_up, statuses, (0.01,)) == "ok"
    assert statuses == [StoreStatus(True, 1, 60.0, "ConnectionResetError: reset by peer"), StoreStatus(False)]


async def test_a_call_that_never_retried_says_nothing() -> None:
    statuses: list[StoreStatus] = []
    assert await _through(_up, statuses, (0.01,)) == "ok"
    assert statuses == []
