"""One store that several runner processes and the test share, named by its location: what
``cubepi-tui run --db`` is given and what :func:`open_location` opens in the test process.

``LOCATIONS`` maps a store kind to a context manager making a fresh, private location for one
test (and removing it after); tests parametrize over its keys, so another kind of store runs
the same tests once it is listed here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from core.checkpoint.base import Checkpointer
from core.checkpoint.sqlite import SQLiteCheckpointer


@asynccontextmanager
async def sqlite_location(tmp_path: Path) -> AsyncIterator[str]:
    """A new SQLite file (created here, so runners and test never race to create it)."""
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    await store.close()
    yield str(path)


LOCATIONS: dict[str, Callable[[Path], AbstractAsyncContextManager[str]]] = {
    "sqlite": sqlite_location,
}
"""Each store kind's location maker, given the test's ``tmp_path``."""


async def open_location(location: str) -> Checkpointer:
    """The test process's own connection to the store at ``location`` (which exists)."""
    return await SQLiteCheckpointer.open(location, create=False)
