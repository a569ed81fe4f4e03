"""Learn that a SQLite store changed, from any process, without polling the database.

Watches the store's directory with ``watchfiles`` (inotify on Linux) and keeps only the
files a commit touches: in WAL mode each commit writes ``<db>-wal`` and the main file
changes at checkpoints; a rollback-journal writer (cubeloop) writes the main file and
creates ``<db>-journal``. ``<db>-shm`` is left out: it changes when connections come and
go, not when data does, so watching it would only cause needless reloads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from watchfiles import Change, awatch


async def watch_sqlite(
    path: str | os.PathLike[str],
    *,
    stop_event: asyncio.Event | None = None,
    step_ms: int = 50,
    max_batch_ms: int = 250,
) -> AsyncIterator[None]:
    """Yield ``None`` once per batch of changes to the database at ``path``.

    A batch ends when no change arrived for ``step_ms`` milliseconds, or after
    ``max_batch_ms`` under a steady stream, so a busy writer still yields a few times a
    second. Changes made through the caller's own connection are reported too. Ends when
    ``stop_event`` is set (within about ``step_ms``). The directory must exist; the file
    itself may appear later. Raises ``FileNotFoundError`` when the directory is missing.
    """
    target = Path(path).absolute()
    names = {target.name, f"{target.name}-wal", f"{target.name}-journal"}

    def ours(_change: Change, changed: str) -> bool:
        return os.path.basename(changed) in names

    async for _batch in awatch(
        target.parent,
        watch_filter=ours,
        stop_event=stop_event,
        step=step_ms,
        debounce=max_batch_ms,
        recursive=False,
    ):
        yield None
