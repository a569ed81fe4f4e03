"""The session asks the store what it can do (``core.checkpoint.capabilities.supports``).

A store that keeps no leases, live events or commands (cubeloop's, or anything that
merely has methods of those names) is browsed, never followed or commanded: asking it
to gives one sentence. Whether it is browse-only comes from ``SchemaUpgrade``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.checkpoint.base import Checkpointer
from core.checkpoint.memory import MemoryCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import CubepiError
from core.owners import UNOWNED
from core.providers.faux import FauxProvider
from tests.helpers.stores import Lookalike, PlainStore
from tui.session import Session
from tui.session_config import SessionConfig


async def _session(store: object, location: str = "") -> Session:
    async def open_store() -> Checkpointer:
        return store  # type: ignore[return-value]

    session = Session(SessionConfig(open_store, FauxProvider, location=location))
    await session.open()
    return session


async def test_a_store_of_ours_is_followed_and_commanded() -> None:
    session = await _session(MemoryCheckpointer())
    assert session.can_watch and not session.needs_upgrade
    session.follower("t")  # no error: the store keeps live runs
    await session.close()


@pytest.mark.parametrize("store", [PlainStore, Lookalike], ids=lambda c: c.__name__)
async def test_a_store_without_live_runs_is_only_browsed(store: type) -> None:
    session = await _session(store(), location="old.sqlite")
    assert not session.can_watch and not session.needs_upgrade
    sentence = "old.sqlite keeps no leases, live events or commands, so its runs cannot be followed or commanded."
    with pytest.raises(CubepiError) as caught:
        await session.send("t", "abort")
    assert str(caught.value) == sentence
    with pytest.raises(CubepiError):
        session.follower("t")
    assert session.followers == set()
    assert await session.refuse_orphaned_aborts("t") == []
    await session.close()


async def test_a_cubeloop_file_is_browse_only_until_upgraded(fixture_db: Path) -> None:
    session = await _session(await SQLiteCheckpointer.open(fixture_db, owner=UNOWNED))
    assert session.needs_upgrade
    await session.upgrade()
    assert not session.needs_upgrade and session.can_watch
    await session.close()
