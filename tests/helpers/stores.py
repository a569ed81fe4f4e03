"""Stand-in stores for tests: shapes of store a real backend of ours does not have."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from core.checkpoint.capabilities import ChangeNotification
from core.checkpoint.memory import MemoryCheckpointer


class PlainStore:
    """A checkpointer without the supervised tables (as a cubeloop-compatible store would be)."""

    def __init__(self) -> None:
        self._inner = MemoryCheckpointer()
        for name in ("append", "save_extra", "list_threads", "claim_run", "mark_run_complete", "close"):
            setattr(self, name, getattr(self._inner, name))

    async def load(self, thread_id: str):
        data = await self._inner.load(thread_id)
        if data is not None:
            data.journal = None  # such a store keeps no journal
        return data


class Lookalike:
    """Every method of the memory store under the same name, but no capability declared:
    what a cubeloop checkpointer or a wrapper looks like to a probe of method names."""

    def __init__(self) -> None:
        self.inner = MemoryCheckpointer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SignalledStore(ChangeNotification):
    """A change token and change signals moved by hand.

    ``token`` is what :meth:`change_token` returns (``reads`` counts the calls);
    :meth:`signal` makes :meth:`change_signals` yield once. With ``fail`` given,
    ``change_signals`` raises it as soon as it is iterated (a store that cannot watch).
    ``quiet`` records the ``quiet_ms`` of each ``change_signals`` call; ``ended`` is set
    when one stopped (by ``stop`` or a cancel).
    """

    def __init__(self, fail: Exception | None = None) -> None:
        self.token = 0
        self.reads = 0
        self.fail = fail
        self.quiet: list[int] = []
        self.ended = asyncio.Event()
        self._signals: asyncio.Queue[None] = asyncio.Queue()

    async def change_token(self) -> int:
        self.reads += 1
        return self.token

    def signal(self) -> None:
        self._signals.put_nowait(None)

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        self.quiet.append(quiet_ms)
        try:
            if self.fail is not None:
                raise self.fail
            while not stop.is_set():
                signal = asyncio.ensure_future(self._signals.get())
                stopping = asyncio.ensure_future(stop.wait())
                try:
                    await asyncio.wait({signal, stopping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    signal.cancel()
                    stopping.cancel()
                if signal.done() and not signal.cancelled():
                    yield None
        finally:
            self.ended.set()
