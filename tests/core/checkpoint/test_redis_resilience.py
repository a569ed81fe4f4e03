"""The Redis store under real trouble: other processes appending at once, connections killed
between and during calls, a reply lost after the server ran the write, and a blocking change
read slower than the socket timeout.

``CLIENT PAUSE`` (used twice, for at most a few seconds) holds every client of the server,
so other tests running at the same time only wait a little; none of them has a socket
timeout that short.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from core.changes import StoreWatch
from core.checkpoint.reconnect import StoreStatus
from core.checkpoint.redis import RedisCheckpointer
from core.messages import user_text
from tests.helpers.children import REPO_ROOT, run_marked
from tests.helpers.redis_tools import LostReplyProxy, admin, kill_connections
from tests.helpers.services import redis_prefix

pytestmark = pytest.mark.redis

DEADLINE = 30.0  # seconds: generous bounds for conditions on a loaded 2-core machine


@pytest.fixture
async def place() -> AsyncIterator[tuple[str, str]]:
    async with redis_prefix("trouble") as found:
        yield found


async def eventually(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def texts(data: object) -> list[str]:
    return [m.text for m in data.messages]  # type: ignore[attr-defined]


async def test_processes_appending_to_one_thread_keep_every_message_once_in_one_order(place: tuple[str, str]) -> None:
    url, prefix = place
    writers, batches = 4, 40
    await asyncio.gather(
        *(
            asyncio.to_thread(
                run_marked,
                [sys.executable, "-m", "tests.helpers.redis_appender", url, prefix, "t", f"w{w}", str(batches)],
                f"appender w{w}",
                cwd=str(REPO_ROOT),
            )
            for w in range(writers)
        )
    )
    async with await RedisCheckpointer.open(url, prefix=prefix, create=False) as store:
        first, again = await store.load("t"), await store.load("t")
        (summary,) = await store.list_threads()
    got = texts(first)
    assert got == texts(again) and first.message_ids == list(range(1, len(got) + 1))  # type: ignore[union-attr]
    assert sorted(got) == sorted(f"w{w}:{i}:{p}" for w in range(writers) for i in range(batches) for p in "ab")
    for w in range(writers):
        mine = [t for t in got if t.startswith(f"w{w}:")]
        assert mine == [f"w{w}:{i}:{p}" for i in range(batches) for p in "ab"], "each writer's order holds"
    for at, text in enumerate(got):
        if text.endswith(":a"):
            assert got[at + 1] == text[:-1] + "b", "a batch is appended as one"
    assert summary.message_count == writers * batches * 2


async def test_connections_killed_between_calls_are_replaced(place: tuple[str, str]) -> None:
    url, prefix = place
    statuses: list[StoreStatus] = []
    async with await RedisCheckpointer.open(url, prefix=prefix, on_status=statuses.append) as store, admin(url) as a:
        await store.append("t", [user_text("one")])
        await store.save_extra("t", {"a": 1})
        assert await kill_connections(a, store.client_name) >= 1
        await store.append("t", [user_text("two")])
        assert await kill_connections(a, store.client_name) >= 1
        await store.save_extra("t", {"b": 2})
        data = await store.load("t")
    assert texts(data) == ["one", "two"] and data.extra == {"a": 1, "b": 2}  # type: ignore[union-attr]
    # redis-py notices a dead idle connection when it takes it from the pool and opens
    # another; any retry the store made was reported, and the store reported itself back.
    assert [s.reconnecting for s in statuses] in ([], [True, False], [True, False, True, False])


async def test_a_connection_killed_during_a_call_is_retried_and_reported(place: tuple[str, str]) -> None:
    url, prefix = place
    statuses: list[StoreStatus] = []
    async with await RedisCheckpointer.open(url, prefix=prefix, on_status=statuses.append) as store, admin(url) as a:
        await store.append("t", [user_text("one")])
        await a.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            appending = asyncio.ensure_future(store.append("t", [user_text("two")]))

            async def held() -> bool:  # the append's script reached the server and waits there
                return any(
                    c.get("name") == store.client_name and (c.get("cmd") == "evalsha" or "b" in c.get("flags", ""))
                    for c in await a.client_list()
                )

            await eventually(held, "the append never reached the paused server")
            assert await kill_connections(a, store.client_name) >= 1
        finally:
            await a.execute_command("CLIENT", "UNPAUSE")
        await asyncio.wait_for(appending, DEADLINE)
        data = await store.load("t")
    assert texts(data) == ["one", "two"]
    assert [s.reconnecting for s in statuses] == [True, False]
    assert statuses[0].attempt == 1 and "Connection" in statuses[0].reason


async def test_kills_during_many_calls_lose_and_double_nothing(place: tuple[str, str]) -> None:
    url, prefix = place
    statuses: list[StoreStatus] = []
    stop = asyncio.Event()
    async with await RedisCheckpointer.open(url, prefix=prefix, on_status=statuses.append) as store, admin(url) as a:

        async def killer() -> int:
            kills = 0
            while not stop.is_set():
                kills += await kill_connections(a, store.client_name)
                await asyncio.sleep(0.005)
            return kills

        killing = asyncio.ensure_future(killer())
        try:
            for i in range(60):
                await store.append("t", [user_text(f"m{i}")])
                await store.save_extra("t", {f"k{i}": i})
                await store.claim_run("t", f"r{i}")
        finally:
            stop.set()
        kills = await killing
        data = await store.load("t")
    assert kills > 0
    assert texts(data) == [f"m{i}" for i in range(60)]
    assert data.extra == {f"k{i}": i for i in range(60)} and len(data.runs) == 60  # type: ignore[union-attr]
    assert [s.reconnecting for s in statuses][-1:] in ([], [False]), "every retry ended with the store back"


async def test_an_append_whose_reply_was_lost_is_not_appended_twice(place: tuple[str, str]) -> None:
    url, prefix = place
    parts = urlsplit(url)
    statuses: list[StoreStatus] = []
    async with LostReplyProxy(parts.hostname or "127.0.0.1", parts.port or 6379, b"EVALSHA") as proxy:
        via_proxy = f"redis://127.0.0.1:{proxy.listen_port}{parts.path}"
        async with await RedisCheckpointer.open(via_proxy, prefix=prefix, on_status=statuses.append) as store:
            await store.append("t", [user_text("one")])  # the server now has the script
            proxy.armed = True
            await store.append("t", [user_text("two"), user_text("three")])
            assert proxy.dropped == 1, "the reply of the append was lost"
            data = await store.load("t")
        assert texts(data) == ["one", "two", "three"]
        assert [s.reconnecting for s in statuses] == [True, False]

        # The control: a plain RPUSH retried by a client after the same loss is pushed twice,
        # so the proxy does lose a reply of a command the server ran.
        plain = aioredis.from_url(via_proxy, socket_timeout=5, retry=Retry(NoBackoff(), 1))
        try:
            proxy.marker, proxy.armed = b"RPUSH", True
            await plain.rpush(f"{prefix}plain", "x")
        finally:
            await plain.aclose()
        async with admin(url) as a:
            assert await a.lrange(f"{prefix}plain", 0, -1) == [b"x", b"x"]


async def test_a_blocking_change_read_outlasting_the_socket_timeout_is_read_again_quietly(
    place: tuple[str, str],
) -> None:
    url, prefix = place
    statuses: list[StoreStatus] = []
    async with (
        await RedisCheckpointer.open(url, prefix=prefix, socket_timeout=0.5, on_status=statuses.append) as watcher,
        await RedisCheckpointer.open(url, prefix=prefix) as writer,
        admin(url) as a,
    ):
        stop = asyncio.Event()
        signals: list[float] = []

        async def watch() -> None:
            async for _ in watcher.change_signals(stop, quiet_ms=10):
                signals.append(time.monotonic())

        watching = asyncio.ensure_future(watch())
        await asyncio.sleep(1.5)  # several blocks of 0.17 s with nothing to read
        assert not watching.done() and signals == []
        # Hold every client for 1.5 s: the watcher's reads now wait past its 0.5 s socket timeout.
        await a.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        await asyncio.sleep(1.6)
        assert not watching.done(), "a read timeout must not end the watch"
        token = await watcher.change_token()
        await writer.append("t", [user_text("hi")])
        assert await watcher.change_token() != token

        async def signalled() -> bool:
            return bool(signals)

        await eventually(signalled, "no change signal after a write")
        stop.set()
        await asyncio.wait_for(watching, DEADLINE)
    assert statuses == [], "a slow blocking read is not a lost connection"


async def test_stopping_a_change_watch_from_outside_leaves_no_connection_and_says_nothing(
    place: tuple[str, str],
) -> None:
    # What the app does each time a thread screen opens and closes: a StoreWatch started,
    # then stopped by cancelling its listening task while the feed read blocks.
    url, prefix = place
    statuses: list[StoreStatus] = []
    async with (
        await RedisCheckpointer.open(url, prefix=prefix, on_status=statuses.append) as store,
        admin(url) as a,
    ):
        changes_name = f"{store.client_name}-changes"

        async def watchers() -> int:
            return sum(1 for entry in await a.client_list() if entry.get("name") == changes_name)

        for cycle in range(6):
            watch = StoreWatch(store)
            await watch.start()

            async def reading() -> bool:
                return await watchers() == 1

            await eventually(reading, f"cycle {cycle}: the watch never opened its connection")
            await watch.stop()

            async def closed() -> bool:
                return await watchers() == 0

            await eventually(closed, f"cycle {cycle}: the watch's connection stayed open after stop()")
        await store.list_threads()  # a call on the pool after the watches: nothing to report
        await asyncio.sleep(0.5)  # a read left running would have reported by now (it retries after 0.1 s)
        assert await watchers() == 0
    assert statuses == [], "stopping a watch is not a lost connection"


async def test_a_change_watch_cancelled_mid_read_leaves_no_read_running(place: tuple[str, str]) -> None:
    # The blocking read ran in a task of its own, which outlived a cancelled watch: it kept
    # retrying on the closed reader and, once it gave up, asyncio printed "Task exception
    # was never retrieved" and a traceback (a runner's stderr at the end of a lost run).
    url, prefix = place
    async with await RedisCheckpointer.open(url, prefix=prefix) as store, admin(url) as a:
        stop = asyncio.Event()

        async def consume() -> None:
            async for _ in store.change_signals(stop):
                pass

        watching = asyncio.ensure_future(consume())

        async def reading() -> bool:
            return any(
                c.get("name") == f"{store.client_name}-changes" and c.get("cmd") == "xread"
                for c in await a.client_list()
            )

        await eventually(reading, "the watch never blocked on its read")
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        left = [
            t
            for t in asyncio.all_tasks()
            if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "RedisStore._call"
        ]
        assert left == [], "a read of the cancelled watch is still running"


async def test_a_change_watch_cancelled_as_its_read_fails_leaves_no_error_unseen(place: tuple[str, str]) -> None:
    # The read failed for good in the very loop turn its watch was cancelled (a runner
    # whose server was gone, stopping at the end of its run): the watch never looked at it,
    # and asyncio printed "Task exception was never retrieved" with a traceback.
    import gc

    from core.checkpoint.reconnect import delays_within
    from tests.helpers.cut_proxy import CutProxy, through

    url, prefix = place
    unseen: list[dict] = []  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unseen.append(context))
    proxy = CutProxy.to(url)
    via = through(url, await proxy.start())
    try:
        async with (
            await RedisCheckpointer.open(via, prefix=prefix, reconnect_delays=delays_within(0.3)) as store,
            admin(url) as a,
        ):
            stop = asyncio.Event()

            async def consume() -> None:
                async for _ in store.change_signals(stop):
                    pass

            watching = asyncio.ensure_future(consume())

            async def reading() -> bool:
                return any(
                    c.get("name") == f"{store.client_name}-changes" and c.get("cmd") == "xread"
                    for c in await a.client_list()
                )

            await eventually(reading, "the watch never blocked on its read")
            (read,) = [
                t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "RedisStore._call"
            ]
            read.add_done_callback(lambda _task, w=watching: w.cancel())  # the same turn the read gave up
            await proxy.cut()
            await asyncio.gather(watching, return_exceptions=True)
            assert read.done() and not read.cancelled()  # it gave up (the case this is about)
            del read, watching, consume
            gc.collect()  # a task's unseen error is reported when the task is destroyed
        assert unseen == []
    finally:
        loop.set_exception_handler(None)
        await proxy.close()
