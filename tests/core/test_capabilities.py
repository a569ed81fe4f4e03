"""Store capabilities are declared, not guessed: ``supports()`` and the callers that ask it.

A store has a capability when it names the protocol among its bases; an object with the
same method names (cubeloop's checkpointers, a wrapper) is not taken for one. The
supervisor, the agent and the change watch all ask ``supports()``; the watch's trigger
is the store's own ``change_signals``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from core.agent import Agent
from core.changes import StoreWatch
from core.checkpoint.capabilities import (
    LIVE,
    ChangeNotification,
    Commands,
    HumanRequests,
    IncrementalReads,
    Jobs,
    Leases,
    LiveEvents,
    SchemaUpgrade,
    SupervisedStore,
    ThreadVersions,
    ToolJournal,
    lacking,
    supports,
)
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import user_text
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.supervisor import Supervisor
from core.tools import tool
from tests.helpers.stores import Lookalike, PlainStore, SignalledStore

EVERY = (
    IncrementalReads,
    ThreadVersions,
    ToolJournal,
    Jobs,
    Leases,
    LiveEvents,
    Commands,
    ChangeNotification,
    HumanRequests,
    SupervisedStore,
)
"""What both of our local backends declare (SQLite also ``SchemaUpgrade``)."""

WAIT = 30.0
"""Seconds a wait may take before the test fails: generous for a loaded 2-core machine."""


# --- supports() ----------------------------------------------------------------------------


@pytest.mark.parametrize("capability", EVERY, ids=lambda c: c.__name__)
async def test_memory_and_sqlite_declare_each_capability(capability: type, tmp_path: Path) -> None:
    assert supports(MemoryCheckpointer(), capability)
    async with await SQLiteCheckpointer.open(tmp_path / "t.sqlite") as store:
        assert supports(store, capability)


async def test_only_sqlite_upgrades_a_schema(tmp_path: Path) -> None:
    assert not supports(MemoryCheckpointer(), SchemaUpgrade)
    async with await SQLiteCheckpointer.open(tmp_path / "t.sqlite") as store:
        assert supports(store, SchemaUpgrade)


@pytest.mark.parametrize("capability", (*EVERY, SchemaUpgrade), ids=lambda c: c.__name__)
def test_same_method_names_are_not_a_capability(capability: type) -> None:
    lookalike = Lookalike()
    # A probe of method names would take it for a supervised store...
    assert all(callable(getattr(lookalike, name, None)) for name in ("load_after", "acquire_lease", "change_token"))
    # ...the declared check does not.
    assert not supports(lookalike, capability)


@pytest.mark.parametrize("capability", (*EVERY, SchemaUpgrade), ids=lambda c: c.__name__)
def test_a_plain_store_and_none_support_nothing(capability: type) -> None:
    assert not supports(PlainStore(), capability)
    assert not supports(None, capability)


def test_lacking_names_the_missing_capabilities_in_order() -> None:
    assert lacking(MemoryCheckpointer(), LIVE) == []
    assert lacking(PlainStore(), LIVE) == [Leases, LiveEvents, Commands, ChangeNotification]
    assert lacking(SignalledStore(), LIVE) == [Leases, LiveEvents, Commands]


# --- the callers ---------------------------------------------------------------------------


@pytest.mark.parametrize("store", [PlainStore, Lookalike, SignalledStore], ids=lambda c: c.__name__)
def test_the_supervisor_refuses_a_store_without_live_events_or_commands(store: type) -> None:
    agent = Agent(FauxProvider(["x"]), MemoryCheckpointer(), "t")
    missing = ", ".join(c.__name__ for c in lacking(store(), LIVE))
    with pytest.raises(TypeError) as caught:
        Supervisor(agent, store())
    assert str(caught.value) == (
        f"{store.__name__} keeps no live events or commands, so its runs cannot be supervised "
        f"(it does not declare {missing} of core.checkpoint.capabilities)."
    )


async def test_the_agent_writes_no_journal_to_a_store_that_does_not_declare_one() -> None:
    @tool
    async def look() -> str:
        """Look."""
        return "looked"

    script = [faux_reply(faux_tool_call("look", id="c1")), "ok"]
    declared = MemoryCheckpointer()
    assert await Agent(FauxProvider(list(script)), declared, "t", tools=(look,)).prompt("go") == "completed"
    assert set(await declared.load_journal("t")) == {"c1"}
    lookalike = Lookalike()
    assert await Agent(FauxProvider(list(script)), lookalike, "t", tools=(look,)).prompt("go") == "completed"
    assert await lookalike.inner.load_journal("t") == {}, "journaled into a store that never said it keeps one"
    assert await lookalike.inner.list_leases() == {}


# --- StoreWatch: the store's signals as the trigger ----------------------------------------


async def test_the_watch_wakes_on_the_stores_signal_and_checks_the_token() -> None:
    store = SignalledStore()
    # A poll far beyond the test's deadline: only a signal can wake the wait in time.
    async with StoreWatch(store, step_ms=7, poll=3600) as watch:
        waiting = asyncio.create_task(watch.wait())
        reads = store.reads
        store.signal()  # a signal that changed nothing: the token is read, the wait goes on
        await _until(lambda: store.reads > reads)
        assert not waiting.done()
        store.token += 1
        store.signal()
        assert await asyncio.wait_for(waiting, WAIT) is True
    assert store.quiet == [7], "the watch's step is the signals' quiet period"
    await asyncio.wait_for(store.ended.wait(), WAIT)


async def test_the_watch_polls_when_the_signals_raise(caplog: pytest.LogCaptureFixture) -> None:
    store = SignalledStore(fail=OSError("no watch here"))
    with caplog.at_level(logging.WARNING, logger="core.changes"):
        async with StoreWatch(store, poll=0.2) as watch:
            await _until(lambda: store.ended.is_set())
            store.token += 1  # no signal will come: the timer finds it
            assert await asyncio.wait_for(watch.wait(), WAIT) is True
    assert "cannot watch SignalledStore for changes; checking every 0.2 s instead" in caplog.text


async def test_without_signals_the_watch_only_polls_quickly() -> None:
    store = SignalledStore()
    async with StoreWatch(store, signals=False) as watch:
        assert watch.poll == 0.05
        store.token += 1
        assert await asyncio.wait_for(watch.wait(), WAIT) is True
    assert store.quiet == [], "change_signals was listened to although signals=False"
    assert StoreWatch(store).poll == 1.0


async def test_the_watch_wakes_from_the_memory_stores_signals() -> None:
    store = MemoryCheckpointer()
    async with StoreWatch(store, step_ms=1, poll=3600) as watch:
        waiting = asyncio.create_task(watch.wait())
        await store.append("t", [user_text("hello")])
        assert await asyncio.wait_for(waiting, WAIT) is True


async def test_the_watch_wakes_from_another_connections_sqlite_commit(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    async with (
        await SQLiteCheckpointer.open(path) as reader,
        await SQLiteCheckpointer.open(path) as writer,
        StoreWatch(reader, step_ms=10, poll=3600) as watch,
    ):
        waiting = asyncio.create_task(watch.wait())
        end = asyncio.get_running_loop().time() + WAIT
        # The file watch is set up in the background: write until it reports a commit.
        while not waiting.done():
            assert asyncio.get_running_loop().time() < end, "no commit woke the watch"
            await writer.append("t", [user_text("hello")])
            await asyncio.wait({waiting}, timeout=0.5)
        assert waiting.result() is True


async def _until(condition, deadline: float = WAIT) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def _protocol_members(protocol: type) -> dict[str, object]:
    """Each method and property a capability protocol (and the protocols it composes) declares."""
    members: dict[str, object] = {}
    for part in protocol.__mro__:
        if part.__module__ != "core.checkpoint.capabilities":
            continue
        for name, value in vars(part).items():
            if not name.startswith("_") and (callable(value) or isinstance(value, property)):
                members.setdefault(name, value)
    return members


@pytest.mark.parametrize(
    "backend",
    [
        "core.checkpoint.memory:MemoryCheckpointer",
        "core.checkpoint.sqlite:SQLiteCheckpointer",
        "core.checkpoint.postgres:PostgresCheckpointer",
        "core.checkpoint.redis:RedisCheckpointer",
    ],
)
def test_every_backend_defines_each_capability_it_declares(backend: str) -> None:
    """A class naming a protocol among its bases inherits the protocol's empty bodies, which
    return ``None`` without a word: each backend must define every member itself."""
    import importlib

    module, name = backend.split(":")
    cls = getattr(importlib.import_module(module), name)
    declared = [c for c in cls.__mro__ if c.__module__ == "core.checkpoint.capabilities"]
    assert SupervisedStore in declared
    inherited = sorted(
        member
        for protocol in declared
        for member, value in _protocol_members(protocol).items()
        if getattr(cls, member, None) is value and member != "upgrade_explanation"
    )
    assert inherited == [], f"{name} leaves {inherited} to the protocol's empty bodies"
