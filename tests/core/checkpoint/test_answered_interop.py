"""A pending request cubeloop answered itself reads answered here, in a cubeloop file and a
cubeloop database opened for browsing (no table of ours, so only cubeloop's answers table
says it): the listing and a load both carry the flag, and the diagnosis made of the listing
is "answered", resumable, not waiting for a person.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cubeloop.checkpointer.postgres import PostgresCheckpointer as CubeloopPostgres
from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite
from cubeloop.hitl.types import ConfirmRequest, HitlRequest
from cubeloop.providers.base import TextContent, UserMessage

from core.checkpoint.postgres import PostgresCheckpointer
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.owners import UNOWNED
from core.recovery import ResumeAction, ThreadState, diagnose
from tests.helpers.pg import make_cubeloop_schema
from tests.helpers.services import postgres_database


def _request(thread_id: str) -> HitlRequest:
    return HitlRequest(
        question_id="q1", thread_id=thread_id, payload=ConfirmRequest(prompt="Ship it?"), created_at=1.7e9
    )


async def _asked(theirs: Any, run_id: str | None) -> None:
    """cubeloop's thread "t" whose run asks "Ship it?"; "u" asks too, never answered."""
    for thread_id in ("t", "u"):
        await theirs.claim_run(thread_id, "r0")
        await theirs.append(thread_id, [UserMessage(content=[TextContent(text="ship")], run_id="r0")])
        await theirs.save_pending_request(thread_id, _request(thread_id), run_id=run_id)


async def _answered_flags(store: Any) -> dict[str, tuple[bool, bool]]:
    """Thread id -> (the listing's flag, the load's flag)."""
    flags: dict[str, tuple[bool, bool]] = {}
    for summary in await store.list_threads():
        assert summary.pending_request is not None
        loaded = await store.load(summary.thread_id)
        flags[summary.thread_id] = (summary.pending_request.answered, loaded.pending_request.answered)
    return flags


async def _check(store: Any) -> None:
    assert store.read_only, "browsed: nothing of ours to read the flag from"
    assert await _answered_flags(store) == {"t": (True, True), "u": (False, False)}
    by_id = {s.thread_id: s for s in await store.list_threads()}
    verdicts = {tid: diagnose(s.tail, s.runs, pending=s.pending_request, tail_only=True) for tid, s in by_id.items()}
    assert (verdicts["t"].state, verdicts["t"].action) == (ThreadState.WAITING, ResumeAction.APPLY_ANSWER)
    assert verdicts["t"].label == "answered: Ship it?"
    assert (verdicts["u"].state, verdicts["u"].action) == (ThreadState.WAITING, ResumeAction.NONE)


@pytest.mark.parametrize("run_id", ["r0", None])
async def test_a_cubeloop_file_answered_by_cubeloop_reads_answered(tmp_path: Path, run_id: str | None) -> None:
    path = tmp_path / "cubeloop.sqlite"
    async with CubeloopSQLite(str(path)) as theirs:
        await _asked(theirs, run_id)
        await theirs.save_hitl_answer("t", "q1", True, run_id=run_id)
    async with await SQLiteCheckpointer.open(path, create=False, owner=UNOWNED) as store:
        await _check(store)


@pytest.mark.postgres
@pytest.mark.parametrize("run_id", ["r0", None])
async def test_a_cubeloop_database_answered_by_cubeloop_reads_answered(run_id: str | None) -> None:
    async with postgres_database("answered") as url:
        await make_cubeloop_schema(url)
        async with CubeloopPostgres(url) as theirs:
            await _asked(theirs, run_id)
            await theirs.save_hitl_answer("t", "q1", True, run_id=run_id)
        store = await PostgresCheckpointer.open(url, create=False, owner=UNOWNED)
        try:
            await _check(store)
        finally:
            await store.close()
