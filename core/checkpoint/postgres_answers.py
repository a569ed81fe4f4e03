"""Human answers in cubeloop's ``cubepi_hitl_answers`` (Postgres): recorded once, settled once.

cubeloop keeps the pending request in two columns of the thread row
(``cubepi_threads.pending_request`` JSONB and ``run_id``) and answers keyed
``(thread_id, run_id, question_id)``, a run of none as ``''``; its ``save_hitl_answer`` is an
upsert (the last writer wins). Here, inside the caller's one transaction
(:meth:`~core.checkpoint.postgres_store.PostgresStore._write`, whose write id makes a retry
after a lost commit give the first attempt's result), the thread row is locked ``FOR
UPDATE`` while its pending request is compared, then ``INSERT ... ON CONFLICT DO NOTHING``:
of two answers from two connections the second waits on the row lock, then finds the key
taken. The change trigger on the answers table (:mod:`core.checkpoint.postgres_schema`)
notifies every watcher at commit.
"""

from __future__ import annotations

from typing import Any

from core.checkpoint import postgres_schema as schema
from core.checkpoint.base import thread_unavailable
from core.checkpoint.postgres_schema import Scope
from core.checkpoint.postgres_supervised import admit, fence
from core.errors import AlreadyAnsweredError, StaleAnswerError
from core.hitl import run_key

Connection = Any

_PENDING_WHERE = "thread_id = $1 AND coalesce(run_id, '') = $2 AND pending_request->>'question_id' = $3"
"""The thread row when its pending request is question ``$3`` of run ``$2``."""

ANSWER_STORED = (
    "(t.pending_request IS NOT NULL AND EXISTS (SELECT 1 FROM cubepi_hitl_answers AS a"
    " WHERE a.thread_id = t.thread_id AND a.run_id = coalesce(t.run_id, '')"
    " AND a.question_id = t.pending_request->>'question_id')) AS answered"
)
"""The select-list column ``answered``: whether the pending request of thread row ``t`` has
its answer stored (one probe of the answers' key, as ``_PENDING_WHERE`` names the request:
its run, ``''`` for none, and ``question_id``; false with no request, without a probe)."""

_STORED = "SELECT answer::text FROM cubepi_hitl_answers WHERE thread_id = $1 AND run_id = $2 AND question_id = $3"


async def answer(conn: Connection, owner: str, thread_id: str, run_id: str | None, question_id: str, text: str) -> None:
    """Record ``text`` (``HumanAnswers.answer``): the owner's admission (a missing thread is
    not adopted), the pending request compared under the row lock, then the insert that
    fails on the key (``AlreadyAnsweredError`` with the stored answer)."""
    run = run_key(run_id)
    await admit(conn, owner, thread_id, adopt=False)
    pending = await conn.fetchval(
        f"SELECT 1 FROM cubepi_threads WHERE {_PENDING_WHERE} FOR UPDATE", thread_id, run, question_id
    )
    if pending is None:
        if not await conn.fetchval(f"SELECT {schema.thread_exists('$1')}", thread_id):
            raise thread_unavailable(thread_id, owner)
        raise StaleAnswerError.of(thread_id, question_id)
    inserted = await conn.fetchval(
        "INSERT INTO cubepi_hitl_answers (thread_id, run_id, question_id, answer) VALUES ($1, $2, $3, $4::jsonb)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        thread_id,
        run,
        question_id,
        text,
    )
    if inserted is None:
        stored = await conn.fetchval(_STORED, thread_id, run, question_id)
        raise AlreadyAnsweredError.of(thread_id, question_id, stored or "")


async def load_answer(
    conn: Connection, scope: Scope, thread_id: str, run_id: str | None, question_id: str
) -> str | None:
    """The stored answer (JSONB's text: the same value, its keys maybe in another order), or
    ``None``, of a thread of ``scope``'s owner."""
    return await conn.fetchval(
        f"{_STORED} AND {scope.visible('$1', '$4')}", thread_id, run_key(run_id), question_id, scope.owner
    )


async def settle_request(
    conn: Connection, owner: str, thread_id: str, run_id: str | None, question_id: str, holder_id: str | None
) -> bool:
    """Compare-and-clear the pending request (both columns, as cubeloop's
    ``clear_pending_request_if_matches`` does, and our exact text beside them), then delete
    that run's answers; after the owner's admission and the fence. ``True`` when cleared."""
    run = run_key(run_id)
    await admit(conn, owner, thread_id, adopt=False)
    await fence(conn, thread_id, holder_id)
    cleared = await conn.fetchval(
        f"UPDATE cubepi_threads SET pending_request = NULL, run_id = NULL, updated_at = now() WHERE {_PENDING_WHERE}"
        " RETURNING 1",
        thread_id,
        run,
        question_id,
    )
    if cleared is None:
        if not await conn.fetchval(f"SELECT {schema.thread_exists('$1')}", thread_id):
            raise thread_unavailable(thread_id, owner)
        return False
    await conn.execute(f"DELETE FROM {schema.PENDING} WHERE thread_id = $1", thread_id)
    await conn.execute("DELETE FROM cubepi_hitl_answers WHERE thread_id = $1 AND run_id = $2", thread_id, run)
    return True
