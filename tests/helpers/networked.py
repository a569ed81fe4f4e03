"""A server store with a fake transport: the memory store behind a connection tests can cut.

Every call of :class:`NetworkedStore` goes through the real
:func:`core.checkpoint.reconnect.with_reconnect`, as the Postgres and Redis backends' calls
do; while its :class:`Link` is down each attempt fails with ``ConnectionResetError``
(what a killed server connection raises), so retries, ``on_status`` and
``StoreConnectionError`` are the real ones. :func:`install` puts such stores where
:func:`core.checkpoint.locations.open_store` looks for the server backends
(``core.checkpoint.postgres.PostgresCheckpointer``, ``core.checkpoint.redis.RedisCheckpointer``),
so a ``postgresql://`` or ``redis://`` location opens one through the real dispatch.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import pytest

from core.checkpoint.capabilities import SchemaUpgrade
from core.checkpoint.locations import describe_location
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.reconnect import OnStatus, with_reconnect
from core.errors import ReadOnlyStoreError

_CALLS = (
    "load",
    "load_after",
    "append",
    "save_extra",
    "list_threads",
    "save_pending_request",
    "claim_run",
    "mark_run_complete",
    "record_tool_event",
    "load_journal",
    "job_begin",
    "job_finish",
    "job_get",
    "acquire_lease",
    "renew_lease",
    "release_lease",
    "get_lease",
    "list_leases",
    "append_live_events",
    "read_live_events",
    "prune_live_events",
    "send_command",
    "update_command",
    "list_commands",
    "change_token",
    "unowned_count",
    "load_meta",
    "save_fingerprints",
    "step_begin",
    "step_commit",
    "step_get",
    "list_steps",
    "delete_thread",
    "answer",
    "load_answer",
    "settle_request",
)
"""The memory store's coroutine methods, each made a call over the fake connection."""

_WRITES = frozenset(
    {
        "append",
        "save_extra",
        "save_pending_request",
        "claim_run",
        "mark_run_complete",
        "record_tool_event",
        "job_begin",
        "job_finish",
        "acquire_lease",
        "append_live_events",
        "send_command",
        "update_command",
        "save_fingerprints",
        "step_begin",
        "step_commit",
        "delete_thread",
        "answer",
        "settle_request",
    }
)


@dataclass
class Link:
    """The fake connection shared by every store one :func:`install` opens.

    ``down``: every attempt fails; ``fail_next``: that many attempts fail, then it is up.
    ``delays`` are the stores' reconnect delays (seconds). ``opened`` records each
    ``open(url, create=..., on_status=...)`` call as ``(url, create, on_status)``;
    ``stores`` the stores opened.
    """

    delays: Sequence[float] = (0.05,) * 10
    down: bool = False
    fail_next: int = 0
    needs_upgrade: bool = False
    attempts: int = 0
    failures: int = 0
    opened: list[tuple[str, bool, OnStatus | None]] = field(default_factory=list)
    stores: list[NetworkedStore] = field(default_factory=list)

    def attempt(self) -> None:
        """One try of a call: raise ``ConnectionResetError`` while the link is down."""
        self.attempts += 1
        if self.down or self.fail_next > 0:
            self.fail_next = max(0, self.fail_next - 1)
            self.failures += 1
            raise ConnectionResetError("the server closed the connection unexpectedly")


class NetworkedStore(MemoryCheckpointer, SchemaUpgrade):
    """A memory store reached through :class:`Link` (see the module docstring); opened
    browse-only when the link says ``needs_upgrade``, like a store of an older schema."""

    link: ClassVar[Link]

    def __init__(self, url: str, on_status: OnStatus | None, owner: str | None = None) -> None:
        super().__init__(owner)
        self.url = url
        self._on_status = on_status
        self._needs_upgrade = self.link.needs_upgrade

    @classmethod
    async def open(
        cls, url: str, *, create: bool = True, on_status: OnStatus | None = None, owner: str | None = None
    ) -> Self:
        """The backends' ``open``: record the call and connect (through ``with_reconnect``)."""
        cls.link.opened.append((url, create, on_status))
        store = cls(url, on_status, owner)
        await store._call("open", _nothing)
        cls.link.stores.append(store)
        return store

    @property
    def where(self) -> str:
        """The URL without its password, as the real backends give it."""
        return describe_location(self.url)

    @property
    def needs_upgrade(self) -> bool:
        return self._needs_upgrade

    @property
    def read_only(self) -> bool:
        return self._needs_upgrade

    async def upgrade(self) -> None:
        await self._call("upgrade", _nothing)
        self._needs_upgrade = False

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        if what in _WRITES and self._needs_upgrade:
            raise ReadOnlyStoreError(f"{self.where} is open for browsing only.")

        async def attempt() -> Any:
            self.link.attempt()
            return await call()

        return await with_reconnect(
            attempt,
            what=what,
            where=self.where,
            is_connection_error=lambda error: isinstance(error, ConnectionError),
            on_status=self._on_status,
            delays=self.link.delays,
        )


async def _nothing() -> None:
    return None


def _over_the_link(name: str) -> Callable[..., Awaitable[Any]]:
    inner = getattr(MemoryCheckpointer, name)

    async def call(self: NetworkedStore, *args: Any, **kwargs: Any) -> Any:
        return await self._call(name, lambda: inner(self, *args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = inner.__doc__
    return call


for _name in _CALLS:
    setattr(NetworkedStore, _name, _over_the_link(_name))


def install(monkeypatch: pytest.MonkeyPatch, link: Link | None = None) -> Link:
    """Make ``postgresql://``/``postgres://`` locations open a ``PostgresCheckpointer`` and
    ``redis://``/``rediss://``/``unix://`` ones a ``RedisCheckpointer``, both
    :class:`NetworkedStore` on ``link`` (a new one by default), until the test ends."""
    link = link or Link()
    for module_name, class_name in (
        ("core.checkpoint.postgres", "PostgresCheckpointer"),
        ("core.checkpoint.redis", "RedisCheckpointer"),
    ):
        module = types.ModuleType(module_name, "A fake server backend (tests.helpers.networked).")
        setattr(module, class_name, type(class_name, (NetworkedStore,), {"link": link}))
        monkeypatch.setitem(sys.modules, module_name, module)
    return link
