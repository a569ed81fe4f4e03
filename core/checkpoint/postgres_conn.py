"""Connections to the PostgreSQL server: the pool, which errors mean the connection broke,
the one-sentence open errors, the URL without its password, the write ids that make a
retried write idempotent, and the sentences for the refusals our write functions raise.

Only :mod:`core.checkpoint.postgres` and its ``postgres_*`` helpers import this module.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict
from typing import Any

import asyncpg

from core.checkpoint import postgres_rows as rows
from core.checkpoint import postgres_schema as schema
from core.checkpoint.addresses import UNREACHABLE, port_problem
from core.checkpoint.base import (
    Command,
    JobRecord,
    Lease,
    StepRecord,
    ThreadMeta,
    check_lease_holder,
    revision_conflict,
    thread_unavailable,
)
from core.checkpoint.redact import redacted
from core.errors import CorruptRecordError, DatabaseOpenError, LeaseLostError, RunAlreadyCompletedError

APPLICATION_NAME = "cubepi-tui"
"""``application_name`` of every connection we open (so an admin can find ours in pg_stat_activity)."""

CONNECT_TIMEOUT = 10.0
"""Seconds to wait for one connection to be set up (TCP, TLS, authentication)."""

WRITE_ID_KEEP = 86400.0
"""Seconds a write id is kept: far longer than any retry (about 26 s, :mod:`core.checkpoint.reconnect`)."""


def where(url: str) -> str:
    """``url`` without its password or query, for sentences ("postgresql://me@db:5432/threads");
    the password rule is :func:`core.checkpoint.redact.redacted`. Never raises."""
    return redacted(url).split("?", 1)[0]


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the connection to the server broke or could not be made, so
    the whole call may be retried on a new one (:func:`core.checkpoint.reconnect.with_reconnect`).

    Yes: the connection-exception class 08 (``ConnectionDoesNotExistError``: the server
    closed it mid-call), the server shutting down or starting (57P01 ``AdminShutdownError``,
    i.e. ``pg_terminate_backend``, 57P02, 57P03 ``CannotConnectNowError``), too many
    connections (53300: others will end theirs), a closed connection or pool used
    (``InterfaceError`` saying so), asyncpg's ``InternalClientError`` (its protocol state
    broke when the server ended an idle connection unasked; the store closes that
    connection), ``OSError`` (refused, reset) and a connect timeout. No:
    every SQL error (a constraint, a syntax, a bad value), which a retry would only repeat.
    """
    if isinstance(
        error,
        (
            asyncpg.PostgresConnectionError,
            asyncpg.AdminShutdownError,
            asyncpg.CrashShutdownError,
            asyncpg.CannotConnectNowError,
            asyncpg.TooManyConnectionsError,
            OSError,
            asyncio.TimeoutError,
        ),
    ):
        return True
    if isinstance(error, asyncpg.InternalClientError):
        # asyncpg's protocol state broke under a connection the server ended unasked (its
        # FATAL reached an idle pooled connection); the store drops that connection.
        return True
    if isinstance(error, asyncpg.InterfaceError):
        text = str(error).lower()
        return "closed" in text or ("connection" in text and "lost" in text)
    return False


def open_error(url: str, error: BaseException) -> DatabaseOpenError:
    """The one sentence for a server that cannot be reached or refuses us (no password in it)."""
    place = where(url)
    port = port_problem(url)
    if port is not None:
        why = port  # asyncpg's own words are an OverflowError's
    elif isinstance(error, (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)):
        why = "the server refused the user name or password"
    elif isinstance(error, asyncpg.InvalidCatalogNameError):
        why = "that database does not exist on the server"
    elif isinstance(error, ConnectionError) and "rejected SSL upgrade" in str(error):
        # asyncpg (0.32, connect_utils) has no class of its own for this refusal.
        why = "the server refused SSL, which the URL's sslmode requires"
    elif isinstance(error, (OSError, asyncio.TimeoutError)) or is_connection_error(error):
        why = UNREACHABLE
    elif isinstance(error, asyncpg.ClientConfigurationError):
        why = (str(error).strip().splitlines() or [""])[0].rstrip(".")  # e.g. which root certificate file is missing
    elif isinstance(error, ValueError):
        why = "the address is not a valid PostgreSQL URL"
    else:
        why = _one_line(error)
    return DatabaseOpenError(f"Cannot open the PostgreSQL database {place}: {why}.")


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


async def connect(url: str, *, read_only: bool) -> asyncpg.Connection:
    """One connection (for opening, upgrades and LISTEN); ``read_only`` makes every
    transaction on it read-only by default, so browsing cannot write even by mistake."""
    return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT, server_settings=_settings(read_only))


async def create_pool(url: str, *, read_only: bool, max_size: int = 10) -> asyncpg.Pool:
    """The pool every store call takes its connection from (see :func:`connect`).

    ``min_size=0``: connections are opened when a call needs one (and kept for the next).
    With a floor, asyncpg (0.32) reopens lost connections in a task of its own, outside
    the store's reconnect policy, and logs a traceback for each failed try ("Failed to
    restore the pool connection floor") for as long as the server stays away."""
    return await asyncpg.create_pool(
        url,
        min_size=0,
        max_size=max_size,
        timeout=CONNECT_TIMEOUT,
        server_settings=_settings(read_only),
        reset=_keep_session,
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing to send. asyncpg's default sends ``SELECT
    pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`` - one more round trip per
    call - but a pooled connection of ours never holds session state: its advisory locks
    are transaction-scoped (``pg_advisory_xact_lock``), it declares no cursor, the change
    watch LISTENs on a connection of its own, and nothing SETs a session variable. asyncpg
    still rolls back a transaction left open before calling this (``Connection._reset``)."""


def _settings(read_only: bool) -> dict[str, str]:
    settings = {"application_name": APPLICATION_NAME}
    if read_only:
        settings["default_transaction_read_only"] = "on"
    return settings


# --- write ids ---------------------------------------------------------------------------------


def new_write_id() -> str:
    """A fresh id for one logical write, kept across its retries."""
    return uuid.uuid4().hex


async def claim_write(conn: Any, write_id: str, thread_id: str | None) -> tuple[bool, Any]:
    """Inside the write's transaction: record ``write_id``; ``(True, None)`` when it is new,
    ``(False, result)`` when an earlier attempt of this write already committed (its
    acknowledgement was lost), with the result that attempt stored. The one-statement
    writes claim theirs inside their function (``cubepi_tui_claim_write``, the same rule)."""
    if await conn.fetchval("SELECT cubepi_tui_claim_write($1, $2, $3)", write_id, thread_id, time.time()):
        return True, None
    stored = await conn.fetchval(f"SELECT result FROM {schema.WRITES} WHERE write_id = $1", write_id)
    return False, unpack_result(stored)


async def store_result(conn: Any, write_id: str, result: Any) -> None:
    """Keep the write's result with its id (only results a retry must give back)."""
    if result is not None:
        await conn.execute(f"UPDATE {schema.WRITES} SET result = $2 WHERE write_id = $1", write_id, pack_result(result))


async def prune_writes(conn: Any) -> None:
    """Forget write ids older than ``WRITE_ID_KEEP``."""
    await conn.execute(f"DELETE FROM {schema.WRITES} WHERE at < $1", time.time() - WRITE_ID_KEEP)


_RESULT_TYPES: dict[str, type] = {"lease": Lease, "command": Command, "job": JobRecord, "step": StepRecord}


def pack_result(result: Any) -> str:
    """A write's result (a bool or int, ``Lease``, ``Command``, ``JobRecord``, ``StepRecord``
    or ``ThreadMeta``) as JSON text."""
    if isinstance(result, ThreadMeta):
        return json.dumps({"type": "meta", "value": rows.meta_json(result)})
    for tag, kind in _RESULT_TYPES.items():
        if isinstance(result, kind):
            return json.dumps({"type": tag, "value": asdict(result)})
    return json.dumps({"type": "plain", "value": result})


def unpack_result(text: str | None) -> Any:
    """The inverse of :func:`pack_result` (``None`` for a write that stored none)."""
    if text is None:
        return None
    packed = json.loads(text)
    if packed["type"] == "meta":
        return rows.meta_of_json(packed["value"])
    kind = _RESULT_TYPES.get(packed["type"])
    return packed["value"] if kind is None else kind(**packed["value"])


# --- refusals raised by our functions --------------------------------------------------------


_REFUSALS = (
    schema.LEASE_REFUSED,
    schema.RUN_COMPLETED,
    schema.EXTRA_NOT_OBJECT,
    schema.THREAD_UNAVAILABLE,
    schema.REVISION_CONFLICT,
)


def refusal(error: BaseException) -> Exception | None:
    """The one-sentence error for a refusal one of our functions raised (an SQLSTATE of
    ``postgres_schema``: ``LEASE_REFUSED`` -> ``LeaseLostError``, ``RUN_COMPLETED`` ->
    ``RunAlreadyCompletedError``, ``EXTRA_NOT_OBJECT`` -> ``CorruptRecordError``,
    ``THREAD_UNAVAILABLE`` -> :func:`~core.checkpoint.base.thread_unavailable`'s
    ``ThreadNotFoundError``, ``REVISION_CONFLICT`` -> :func:`~core.checkpoint.base.revision_conflict`'s
    ``ConflictError``), or ``None`` for any other error. Nothing was written: the refusal
    aborted the transaction."""
    if not isinstance(error, asyncpg.PostgresError):
        return None
    code = error.sqlstate
    if code not in _REFUSALS:
        return None
    detail = json.loads(error.detail)
    thread_id = detail["thread_id"]
    if code == schema.THREAD_UNAVAILABLE:
        return thread_unavailable(thread_id, detail["owner"])
    if code == schema.REVISION_CONFLICT:
        return revision_conflict(thread_id, detail["record"], detail["expected"], detail["actual"])
    if code == schema.RUN_COMPLETED:
        return RunAlreadyCompletedError(
            f"Run {detail['run_id']} of thread {thread_id!r} is already completed, so nothing was appended."
        )
    if code == schema.EXTRA_NOT_OBJECT:
        return CorruptRecordError(
            f"The extra data of thread {thread_id!r} is not a JSON object, so it was left"
            " unchanged and the new keys were not saved.",
            thread_id=thread_id,
            row_id="extra",
        )
    lease = None if detail["lease"] is None else Lease(**detail["lease"])
    try:
        # The sentence (and its "why") is the rule's own; the server applied the same rule.
        check_lease_holder(lease, thread_id, detail["holder_id"], detail["now"])
    except LeaseLostError as lost:
        return lost
    # Reached only if the two copies of the rule disagreed: the write was refused all the same.
    return LeaseLostError(
        f"This run no longer holds the lease on thread {thread_id!r}, so nothing was written.", why="refused"
    )
