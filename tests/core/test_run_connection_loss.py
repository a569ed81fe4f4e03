"""A headless run whose server connections are cut under it (issue 8, item 5).

Each test starts a real runner process (``python -m core.runner run --demo``) on a real
PostgreSQL database or Redis key prefix of its own, and cuts its connections mid-run:

* again and again at random moments (Postgres ``pg_terminate_backend`` of every backend of
  the test's database but the killer's own; Redis ``CLIENT KILL`` of the runner's
  connections): the run completes, with every message once and in order, and the runner
  says only "reconnecting" / "reconnected" on stderr;
* for longer than the runner's reconnect wait (a proxy that refuses connections): the
  runner exits 1 with one sentence naming the server, what it had saved is unchanged, and
  ``--resume`` finishes the thread once the server is back.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from core.checkpoint import codec
from core.checkpoint.base import CheckpointData, Checkpointer
from core.checkpoint.locations import describe_location, open_store
from core.commands import send
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.recovery import ThreadState, diagnose, unanswered_calls
from core.request import build_request
from core.runner import describe
from tests.helpers.cut_proxy import CutProxy, through
from tests.helpers.store_backends import new_location
from tests.helpers.store_locations import split_redis_location
from tests.helpers.supervise import Runner, runner_argv

SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
]

DEADLINE = 120.0
"""Seconds a run or a wait may take before the test fails: a liveness bound for a loaded
2-core machine, reached only by a failing test."""

SPEED = "2"
"""Demo pace: its run takes several seconds, so the cuts land while it works."""

PROMPT = "Summarise the sales figures"
FOLLOW_UP = "Now compare them with last year"
THREAD = "t-cut"

NOTICE = re.compile(r"^store: (reconnecting to \S+ \(attempt \d+, next in \d+\.\d s\)…: \S.*|reconnected to \S+)$")
"""A line of the runner's stderr while its store reconnects (``core.runner._status_printer``)."""


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def location(server: str, tmp_path: Path) -> AsyncIterator[str]:
    async with new_location(server, tmp_path, "cut") as found:
        yield found


@asynccontextmanager
async def opened(location: str) -> AsyncIterator[Checkpointer]:
    store = await open_store(location, create=True)
    try:
        yield store
    finally:
        await store.close()


async def eventually(check: Callable[[], Awaitable[object]], what: str, runner: Runner | None = None) -> object:
    deadline = time.monotonic() + DEADLINE
    while not (found := await check()):
        if runner is not None and not runner.alive():
            out, err = runner.output()
            pytest.fail(f"the runner exited ({runner.proc.returncode}) before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return found


# --- killing a runner's connections -------------------------------------------------------------


class PostgresKiller:
    """``pg_terminate_backend`` of every backend of the test's database but its own."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = None

    async def __aenter__(self) -> PostgresKiller:
        import asyncpg

        self.conn = await asyncpg.connect(self.url, timeout=10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()  # type: ignore[union-attr]

    async def kill(self) -> int:
        rows = await self.conn.fetch(  # type: ignore[union-attr]
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return sum(1 for row in rows if row[0])


class RedisKiller:
    """``CLIENT KILL`` of every connection of the runner process: its store's client name
    (and its change reader's, which starts with it), found once from the process's sockets."""

    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid
        self.names: set[str] = set()

    async def __aenter__(self) -> RedisKiller:
        import redis.asyncio as aioredis

        self.client = aioredis.from_url(self.url, socket_timeout=10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def kill(self) -> int:
        from tests.helpers.redis_tools import kill_connections, names_of_process

        if not self.names:
            # The change reader is named after the store's client: keep the shortest.
            found = sorted(await names_of_process(self.client, self.pid), key=len)
            self.names = {n for n in found if not any(n != m and n.startswith(m) for m in found)}
        return sum([await kill_connections(self.client, name) for name in self.names])


def killer(server: str, location: str, pid: int) -> PostgresKiller | RedisKiller:
    if server == "postgres":
        return PostgresKiller(location)
    return RedisKiller(split_redis_location(location)[0], pid)


# --- what a finished thread must look like --------------------------------------------------------


def check_whole(data: CheckpointData) -> None:
    """Every call answered exactly once, before the next reply (so no request the model got
    held a dangling call), nothing for the request builder to repair, and completed."""
    messages = data.messages
    assert unanswered_calls(messages) == []
    assert build_request(messages).repairs == ()
    results = [m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)]
    assert len(results) == len(set(results)), "a tool result twice"
    open_calls: set[str] = set()
    for m in messages:
        if isinstance(m, AssistantMessage):
            assert not open_calls, f"a reply was asked for with calls unanswered: {open_calls}"
            open_calls = {c.id for c in m.tool_calls}
        elif isinstance(m, ToolResultMessage):
            assert m.tool_call_id in open_calls, "a result that answers no call of the reply before it"
            open_calls.discard(m.tool_call_id)
    assert not open_calls
    assert data.message_ids == sorted(set(data.message_ids)), "ids in order, each once"
    assert diagnose(messages, data.runs, data.journal).state is ThreadState.COMPLETED
    assert data.runs and all(r.completed for r in data.runs)


def shape(messages: list) -> list[str]:  # type: ignore[type-arg]
    """Each message as its role and what it holds: ``user:prompt``, ``assistant:fetch_dataset+train_model``."""
    out = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(f"user:{(m.metadata or {}).get('kind', 'prompt')}")
        elif isinstance(m, AssistantMessage):
            out.append("assistant:" + "+".join(sorted(c.name for c in m.tool_calls)))
        else:
            out.append(f"tool:{m.tool_name}")
    return out


DEMO_RUN = ["user:prompt", "assistant:fetch_dataset+train_model", "tool:*", "tool:*"]
DEMO_RUN += ["assistant:write_report", "tool:write_report", "assistant:"]
FOLLOWED = [*DEMO_RUN, "user:follow_up", "assistant:write_report", "tool:write_report", "assistant:"]


def matches(got: list[str], wanted: list[str]) -> bool:
    if len(got) != len(wanted):
        return False
    return all((w == "tool:*" and g.startswith("tool:")) or g == w for g, w in zip(got, wanted, strict=True))


# --- the tests ------------------------------------------------------------------------------------


async def test_a_run_whose_connections_are_cut_again_and_again_completes_with_nothing_lost(
    server: str, location: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CUBEPI_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    async with opened(location) as store:
        runner = Runner(runner_argv(location, THREAD, "--demo", "--speed", SPEED, PROMPT), tmp_path, to_files=True)
        kills = rounds = 0
        try:
            async with killer(server, location, runner.pid) as cutter:
                await eventually(lambda: store.get_lease(THREAD), "the runner's lease", runner)
                await send(store, THREAD, "follow_up", FOLLOW_UP)
                deadline = time.monotonic() + DEADLINE
                while runner.alive():
                    assert time.monotonic() < deadline, "the run did not end"
                    await asyncio.sleep(rng.uniform(0.05, 0.6))
                    kills += await cutter.kill()
                    rounds += 1
            status = await runner.wait()
        finally:
            runner.kill()
        out, err = runner.output()
        context = f"seed {seed}, {kills} connections killed in {rounds} rounds\nstdout:\n{out}\nstderr:\n{err}"
        assert status == 0, context
        data = await store.load(THREAD)
    assert data is not None
    assert matches(shape(data.messages), FOLLOWED), f"{shape(data.messages)}\n{context}"
    assert [m.text for m in data.messages if isinstance(m, UserMessage)] == [PROMPT, FOLLOW_UP]
    assert not any(isinstance(m, ToolResultMessage) and m.is_error for m in data.messages), context
    check_whole(data)
    # What the runner printed, message by message, is what the store holds: each once, in order.
    assert out.splitlines() == [*(describe(m) for m in data.messages), "run completed"], context
    lines = err.splitlines()
    assert all(NOTICE.match(line) for line in lines), context
    assert any("reconnecting to" in line for line in lines) and any("reconnected to" in line for line in lines), context
    assert kills > 0, context


def with_password(location: str) -> tuple[str, str | None]:
    """A Postgres URL given a password when it has none (the test server trusts the user,
    so it is never asked for), to see that no sentence shows it; Redis refuses an AUTH it
    was not configured for, so its URL stays as it is. ``(url, password)``."""
    parts = urlsplit(location)
    if not location.startswith("postgres") or parts.password:
        return location, parts.password
    password = "s3cret-pw-9"
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)), password


async def test_a_server_gone_past_the_reconnect_wait_fails_the_run_in_one_sentence_and_resume_completes_it(
    server: str, location: str, tmp_path: Path
) -> None:
    async with opened(location) as store:
        proxy = CutProxy.to(location)
        via, password = with_password(through(location, await proxy.start()))
        try:
            argv = runner_argv(via, THREAD, "--demo", "--speed", SPEED, "--reconnect-wait", "2", PROMPT)
            runner = Runner(argv, tmp_path, to_files=True)
            try:

                async def mid_tool() -> CheckpointData | None:
                    data = await store.load(THREAD)
                    journal = (data.journal or {}) if data is not None else {}
                    return data if data is not None and len(data.messages) >= 2 and journal else None

                await eventually(mid_tool, "the first tools started", runner)
                before = await store.load(THREAD)
                await proxy.cut()
                status = await runner.wait(DEADLINE)
            finally:
                runner.kill()
            out, err = runner.output()
            context = f"stdout:\n{out}\nstderr:\n{err}"
            assert status == 1, context
            lines = err.splitlines()
            said = [line for line in lines if not NOTICE.match(line)]
            where = re.escape(describe_location(via).split("?", 1)[0])
            assert len(said) == 1 and re.fullmatch(
                rf"Lost the connection to {where} and could not get it back in 2 s, so the [a-z ]+ did not complete"
                r" \([A-Za-z.]+: [^\n]+\)\.",
                said[0],
            ), context
            assert said[0] == lines[-1] and "Traceback" not in err, context
            assert out.splitlines()[-1].startswith("run failed: "), context
            assert password is None or password not in err + out, context
            # Everything the run had saved before the cut is still there, unchanged.
            assert before is not None
            after = await store.load(THREAD)
            assert after is not None
            kept = len(before.messages)
            assert [codec.encode(m) for m in after.messages[:kept]] == [codec.encode(m) for m in before.messages]
            assert after.message_ids[:kept] == before.message_ids
            assert unanswered_calls(after.messages), "it was cut mid-tool"

            await proxy.restore()
            resumed = Runner(runner_argv(via, THREAD, "--demo", "--speed", SPEED, "--resume"), tmp_path, to_files=True)
            try:
                status = await resumed.wait(DEADLINE)
            finally:
                resumed.kill()
            out, err = resumed.output()
            assert status == 0, f"stdout:\n{out}\nstderr:\n{err}"
            assert out.splitlines()[-1] == "run completed" and err == "", f"stdout:\n{out}\nstderr:\n{err}"
        finally:
            await proxy.close()
        done = await store.load(THREAD)
    assert done is not None
    assert [codec.encode(m) for m in done.messages[:kept]] == [codec.encode(m) for m in before.messages]
    assert done.message_ids[:kept] == before.message_ids
    assert matches(shape(done.messages), DEMO_RUN), shape(done.messages)
    check_whole(done)
