"""Stand-in stores for tests: shapes of store a real backend of ours does not have."""

from __future__ import annotations

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
