"""Session: the app's runtime side, with no widgets in it.

One store, one provider, and one :class:`core.agent.Agent` per thread that has run in
this app. Screens get the session in their constructor and call it from workers; every
method that touches the store is a coroutine and never blocks the event loop itself.
Errors a user can meet come out as :class:`core.errors.CubepiError` whose text is one
sentence, ready for the screen.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from core.agent import Agent
from core.checkpoint.base import CheckpointData, Checkpointer, ThreadSummary
from core.errors import CubepiError, ThreadNotFoundError
from core.recovery import Diagnosis, diagnose

StoreOpener = Callable[[], Awaitable[Checkpointer]]
"""Opens the database; raises ``DatabaseOpenError`` with one sentence when it cannot."""

ProviderFactory = Callable[[], Any]
"""Builds the model provider; may raise ``MissingApiKeyError`` (then runs are disabled)."""


@runtime_checkable
class Upgradable(Protocol):
    """A store that may open a foreign or older database browse-only until upgraded."""

    needs_upgrade: bool

    async def upgrade(self) -> None:
        """Migrate the database so this app can write to it (one transaction)."""
        ...


UPGRADE_EXPLANATION = (
    "This database was written by another program (cubeloop) or an older version and is open "
    "for browsing only. To write to it, cubepi-tui adds its own tables beside the existing ones "
    "and switches the file to WAL journaling; no existing row is changed and cubeloop can still "
    "read and write it. Upgrade now?"
)


@dataclass(frozen=True, slots=True)
class ThreadRow:
    """One line of the picker: a thread's id, state, size, last activity and first prompt."""

    thread_id: str
    state: str
    message_count: int
    last_activity: float | None
    first_prompt: str
    diagnosis: Diagnosis
    running: bool = False
    """Whether an agent of this app runs it now."""
    problems: int = 0
    """Undecodable rows in the thread's tail."""
    elsewhere: bool = False
    """Whether another process holds a live lease on it (it runs there)."""


@dataclass
class Session:
    """Everything the screens drive: the store, the provider and the live agents.

    ``location`` names the database for messages ("~/.local/share/.../threads.sqlite").
    ``tools`` and ``system_prompt`` are given to every Agent; ``model`` is shown in the
    status bar. ``agent_options`` are passed to ``Agent`` as keywords (e.g. abort_grace).
    """

    open_store: StoreOpener
    make_provider: ProviderFactory
    location: str = ""
    model: str = ""
    tools: Sequence[Any] = ()
    system_prompt: str = ""
    agent_options: dict[str, Any] = field(default_factory=dict)
    store: Checkpointer | None = None
    provider: Any = None
    provider_error: str | None = None
    agents: dict[str, Agent] = field(default_factory=dict)
    watch_changes: Callable[[], AsyncIterator[None]] | None = None
    """Yields once per batch of changes to the store on disk (``None``: the store cannot tell)."""
    on_busy: Callable[[int], None] | None = None
    """Told the attempt number each time the database was locked and a call is retried."""

    def report_busy(self, attempt: int) -> None:
        """Pass a "database is locked, retrying" notice on to ``on_busy`` (the app shows it)."""
        if self.on_busy is not None:
            self.on_busy(attempt)

    async def open(self) -> None:
        """Open the store and build the provider.

        Raises the store's ``CubepiError`` (one sentence) when the database cannot be
        opened. A provider that cannot be built does not raise: ``provider_error`` keeps
        its sentence and runs are refused with it, while browsing still works.
        """
        self.store = await self.open_store()
        try:
            self.provider = self.make_provider()
        except CubepiError as error:
            self.provider_error = str(error)

    def running_count(self) -> int:
        """How many agents of this app are running now."""
        return sum(agent.state.is_running for agent in self.agents.values())

    async def stop_runs(self, timeout: float = 8.0) -> None:
        """Abort every live run and wait (up to ``timeout`` seconds) until each has ended.

        An aborted run ends cleanly: its last message is saved and its lease released,
        so the thread reads "aborted" rather than "crashed" next time.
        """
        running = [agent for agent in self.agents.values() if agent.state.is_running]
        for agent in running:
            agent.abort()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(agent.state.is_running for agent in running) and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Stop live runs, then close the store (never under a run that still writes)."""
        await self.stop_runs()
        if self.store is not None:
            await self.store.close()

    # --- browsing -----------------------------------------------------------------------

    async def rows(self) -> list[ThreadRow]:
        """Every thread in the store, most recently active first, with its state."""
        summaries = await self._store().list_threads()
        return [self._row(summary) for summary in summaries]

    def _row(self, summary: ThreadSummary) -> ThreadRow:
        diagnosis = diagnose(summary.tail, summary.runs)
        running = self.is_running(summary.thread_id)
        lease = summary.lease
        elsewhere = not running and lease is not None and lease.expires_at > time.time()
        if running:
            state = "running here"
        elif elsewhere and lease is not None:
            state = f"running elsewhere (pid {lease.pid} on {lease.host})"
        else:
            state = diagnosis.label
        return ThreadRow(
            thread_id=summary.thread_id,
            state=state,
            message_count=summary.message_count,
            last_activity=summary.last_activity,
            first_prompt=summary.first_prompt,
            diagnosis=diagnosis,
            running=running,
            problems=len(summary.problems),
            elsewhere=elsewhere,
        )

    async def load(self, thread_id: str, *, must_exist: bool = True) -> tuple[CheckpointData, Diagnosis]:
        """The thread's stored data and its diagnosis.

        Raises ``ThreadNotFoundError`` for an unknown id when ``must_exist``; otherwise an
        unknown id loads as an empty thread (a new one).
        """
        store = self._store()
        data = await store.load(thread_id)
        if data is None:
            if must_exist:
                raise ThreadNotFoundError(f"There is no thread {thread_id!r} in {self.location or 'this database'}.")
            data = CheckpointData()
        return data, diagnose(data.messages, data.runs, data.journal)

    def is_running(self, thread_id: str) -> bool:
        """Whether an agent of this app is running ``thread_id`` now."""
        agent = self.agents.get(thread_id)
        return agent is not None and agent.state.is_running

    @property
    def needs_upgrade(self) -> bool:
        """Whether the store is browse-only until the user agrees to upgrade it."""
        return isinstance(self.store, Upgradable) and bool(self.store.needs_upgrade)

    async def upgrade(self) -> None:
        """Upgrade a browse-only store (after the user agreed)."""
        if isinstance(self.store, Upgradable):
            await self.store.upgrade()

    # --- running ------------------------------------------------------------------------

    async def agent(self, thread_id: str) -> Agent:
        """The agent of ``thread_id``, created and loaded on first use.

        Raises ``CubepiError`` with ``provider_error`` when no provider could be built.
        """
        agent = self.agents.get(thread_id)
        if agent is not None:
            if not agent.state.is_running:
                await agent.load()  # another process may have written since
            return agent
        if self.provider is None:
            raise CubepiError(self.provider_error or "No model provider is configured.")
        agent = Agent(
            self.provider,
            self._store(),
            thread_id,
            tools=tuple(self.tools),
            system_prompt=self.system_prompt,
            **self.agent_options,
        )
        await agent.load()
        self.agents[thread_id] = agent
        return agent

    def _store(self) -> Checkpointer:
        if self.store is None:
            raise CubepiError("The database is not open.")
        return self.store
