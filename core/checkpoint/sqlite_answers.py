"""Human answers in cubeloop's ``thread_hitl_answers`` (SQLite): recorded once, settled once.

cubeloop's table (``PRIMARY KEY (thread_id, run_id, question_id)``, a run of none stored as
``''``) and its pending row (``thread_pending_request``, one per thread) are used as they
are; only the statements differ from cubeloop's ``save_hitl_answer``, which is ``INSERT OR
REPLACE`` (the last writer wins). Here the pending row is compared and the answer inserted
with a plain ``INSERT`` inside one ``BEGIN IMMEDIATE``, so of two answers from two
connections the second waits for the first's commit and fails on the key.

Each function runs on the connection thread as one whole transaction (see
:mod:`core.checkpoint.sqlite_queries`).
"""

from __future__ import annotations

import sqlite3

from core.checkpoint.base import thread_unavailable
from core.checkpoint.sqlite_owners import exists, owned
from core.checkpoint.sqlite_schema import Layout, read_txn, write_txn
from core.checkpoint.sqlite_supervised import fence
from core.errors import AlreadyAnsweredError, StaleAnswerError
from core.hitl import run_key


def _question_of(request_json: str) -> str:
    """SQL for the question id in column ``request_json`` of a pending row: ``NULL`` for a
    row that is not JSON (json_extract would raise on it)."""
    return f"CASE WHEN json_valid({request_json}) THEN json_extract({request_json}, '$.question_id') END"


# The thread's pending row when it is this question of this run.
_PENDING_WHERE = (
    "thread_pending_request WHERE thread_id = :thread AND coalesce(run_id, '') = :run"
    f" AND {_question_of('request_json')} = :question"
)
_STORED = "SELECT answer_json FROM thread_hitl_answers WHERE thread_id = :thread AND run_id = :run AND question_id = :question"


def answer_stored(layout: Layout, row: str, run: str) -> str:
    """SQL (0 or 1) for whether pending row alias ``row``, of run column ``run`` (``NULL``
    for a table without one), has its answer stored: the row's run (``''`` for none) and
    question id in ``thread_hitl_answers``, one probe of its key; 0 without that table."""
    if not layout.has("thread_hitl_answers"):
        return "0"
    return (
        f"EXISTS (SELECT 1 FROM thread_hitl_answers AS a WHERE a.thread_id = {row}.thread_id"
        f" AND a.run_id = coalesce({run}, '') AND a.question_id = {_question_of(f'{row}.request_json')})"
    )


def _args(owner: str, thread_id: str, run_id: str | None, question_id: str) -> dict[str, str]:
    return {"thread": thread_id, "owner": owner, "run": run_key(run_id), "question": question_id}


def _check_owned(c: sqlite3.Connection, layout: Layout, args: dict[str, str]) -> None:
    """Raise ``thread_unavailable`` unless the thread exists and is the owner's; unlike the
    admission of other writes, a missing thread is not created (nothing can be answered there)."""
    if not c.execute(f"SELECT {owned(layout)} AND {exists(layout)}", args).fetchone()[0]:
        raise thread_unavailable(args["thread"], args["owner"])


def answer(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, run_id: str | None, question_id: str, text: str
) -> None:
    """Record ``text`` as the answer (``HumanAnswers.answer``): the owner, the pending row,
    then the plain ``INSERT``; a key already there raises ``AlreadyAnsweredError`` with the
    stored answer, read in the same transaction."""
    args = _args(owner, thread_id, run_id, question_id)
    with write_txn(c):
        _check_owned(c, layout, args)
        if c.execute(f"SELECT 1 FROM {_PENDING_WHERE}", args).fetchone() is None:
            raise StaleAnswerError.of(thread_id, question_id)
        try:
            c.execute(
                "INSERT INTO thread_hitl_answers (thread_id, run_id, question_id, answer_json)"
                " VALUES (:thread, :run, :question, :answer)",
                {**args, "answer": text},
            )
        except sqlite3.IntegrityError:
            stored = c.execute(_STORED, args).fetchone()
            raise AlreadyAnsweredError.of(thread_id, question_id, str(stored[0]) if stored else "") from None


def load_answer(
    c: sqlite3.Connection, layout: Layout, owner: str, thread_id: str, run_id: str | None, question_id: str
) -> str | None:
    """The stored answer text, ``None`` when there is none or the thread is not the owner's."""
    if not layout.has("thread_hitl_answers"):
        return None
    args = _args(owner, thread_id, run_id, question_id)
    with read_txn(c):
        row = c.execute(f"{_STORED} AND {owned(layout)}", args).fetchone()
    return None if row is None else str(row[0])


def settle_request(
    c: sqlite3.Connection,
    layout: Layout,
    owner: str,
    thread_id: str,
    run_id: str | None,
    question_id: str,
    holder_id: str | None,
    locked_since: float | None,
) -> bool:
    """Compare-and-delete the pending row, then delete that run's answers
    (``HumanAnswers.settle_request``), after the owner and the lease fence; ``True`` when
    the row was deleted."""
    args = _args(owner, thread_id, run_id, question_id)
    with write_txn(c):
        _check_owned(c, layout, args)
        fence(c, thread_id, holder_id, locked_since)
        cleared = c.execute(f"DELETE FROM {_PENDING_WHERE}", args).rowcount
        if cleared:
            c.execute("DELETE FROM thread_hitl_answers WHERE thread_id = :thread AND run_id = :run", args)
    return cleared > 0
