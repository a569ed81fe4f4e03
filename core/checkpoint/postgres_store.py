"""One open PostgreSQL store: how it was opened (read-write, new, browse-only), its upgrade,
the reconnecting call every store method goes through, and the change watch.

:class:`PostgresStore` is the base of :class:`~core.checkpoint.postgres.PostgresCheckpointer`,
which adds the store's methods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, Self, TypeVar

import asyncpg

from core.checkpoint import postgres_conn as pg
from core.checkpoint import postgres_schema as schema
from core.checkpoint.reconnect import RECONNECT_DELAYS, OnStatus, with_reconnect
from core.errors import CheckpointError, DatabaseOpenError, ReadOnlyStoreError, SchemaError
from core.owners import resolve_owner

T = TypeVar("T")

BROWSE_POLL = 0.5
"""Seconds between two change-token reads of ``change_signals`` on a database without our
triggers (browse-only of a cubeloop database: there is nothing to LISTEN to)."""

WATCH_CHECK = 1.0
"""Seconds between two checks that the LISTEN connection is still alive."""

BeforeCommit = Callable[[str, Any], Awaitable[None]]
"""The test seam's type: ``await hook(what, conn)`` (see ``PostgresStore._before_commit``)."""


class PostgresStore:
    """An open database and its mode; use :meth:`open` (a subclass gets its own type back).

    Every call goes through :meth:`_read` or :meth:`_write`: one transaction on a pooled
    connection, retried on a new connection while the old one broke
    (:func:`core.checkpoint.reconnect.with_reconnect`). A write carries one write id across
    its retries, recorded in its own transaction, so an attempt whose commit went through
    but whose acknowledgement was lost is found, not repeated.

    The store is opened for one owner (:mod:`core.owners`): every query it sends carries
    that owner (:class:`~core.checkpoint.postgres_schema.Scope`), and every write passes the
    server-side admission ``cubepi_tui_own`` inside its own transaction.
    """

    _before_commit: BeforeCommit | None = None
    """Test seam, private: when set, every write awaits ``_before_commit(what, conn)`` inside
    its transaction, after its statements ran (the compare-and-set UPDATE included) and
    before COMMIT, with ``what`` the write's name ("save", "step commit", ...) and ``conn``
    the asyncpg connection holding the open transaction. An exception it raises rolls the
    write back; a process killed while it waits leaves the transaction uncommitted, which
    the server rolls back when the connection drops. The one-statement writes then run in
    an explicit transaction (BEGIN, the function, the hook, COMMIT) instead of an implicit
    one. Never set outside tests."""

    def __init__(
        self,
        url: str,
        pool: asyncpg.Pool,
        layout: schema.Layout,
        on_status: OnStatus | None,
        reconnect_delays: Sequence[float] = RECONNECT_DELAYS,
        owner: str = "",
    ) -> None:
        """Internal: use :meth:`open`."""
        self._owner = owner
        self._url = url
        self._where = pg.where(url)
        self._pool: asyncpg.Pool | None = pool
        self._layout = layout
        self._on_status = on_status
        self._reconnect_delays = tuple(reconnect_delays)

    # --- opening -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        create: bool = True,
        on_status: OnStatus | None = None,
        reconnect_delays: Sequence[float] = RECONNECT_DELAYS,
        owner: str | None = None,
    ) -> Self:
        """Open the database at ``url`` (``postgresql://user:password@host:port/database``)
        for ``owner`` (``None``: the default owner, :func:`core.owners.resolve_owner`;
        :data:`core.owners.UNOWNED`: the threads that record no owner - cubeloop's, and ours
        from before owners).

        * cubeloop's v5 tables and ours at this version: read-write.
        * empty (neither): with ``create``, cubeloop's v5 tables (exactly as its metadata
          creates them, with the 64 partitions and version row 5) and ours, in one
          transaction; without, ``DatabaseOpenError``.
        * cubeloop's v5 tables without ours, or ours at an older version: **browse-only**
          (``needs_upgrade``): reads work, the supervision readers return ``None`` / empty
          (without ours), every write raises ``ReadOnlyStoreError``, and the connections'
          transactions are read-only, so browsing never changes the database, until
          :meth:`upgrade`.
        * ours newer than this version, or cubeloop's at another version than 5: ``SchemaError``.

        Raises ``DatabaseOpenError`` (one sentence naming the server, without password) when
        the server cannot be reached, refuses the login, or the URL is not valid. Opening is
        not retried: a server that is down is said at once. ``on_status`` is told of every
        reconnect of a later call (see :class:`~core.checkpoint.reconnect.StoreStatus`);
        ``reconnect_delays`` (seconds) are that call's waits before each retry
        (:func:`core.checkpoint.reconnect.delays_within` makes shorter ones). Raises
        ``ValueError`` (one sentence, nothing opened) for an owner name
        :func:`core.owners.check_owner` refuses.
        """
        who = resolve_owner(owner)
        place = pg.where(url)
        try:
            conn = await pg.connect(url, read_only=True)
        except Exception as error:
            raise pg.open_error(url, error) from None
        try:
            layout = await schema.read_layout(conn)
        except asyncpg.PostgresError as error:
            raise pg.open_error(url, error) from None
        finally:
            await conn.close()
        if layout.empty:
            if not create:
                raise DatabaseOpenError(f"The PostgreSQL database {place} holds no agent threads (no cubeloop tables).")
            layout = await _create(url)
        _check_versions(place, layout)
        writable = layout.version == len(schema.MIGRATIONS)
        try:
            pool = await pg.create_pool(url, read_only=not writable)
        except Exception as error:
            raise pg.open_error(url, error) from None
        store = cls(url, pool, layout, on_status, reconnect_delays, who)
        if writable:
            with contextlib.suppress(asyncpg.PostgresError):  # housekeeping only
                async with pool.acquire() as conn:
                    await pg.prune_writes(conn)
        return store

    async def upgrade(self) -> None:
        """Make a browse-only store writable: add our tables (or migrate older ones) in one
        transaction; no row of cubeloop's changes, and cubeloop reads and writes the database
        as before. A no-op on a writable store. Raises ``DatabaseOpenError`` when the server
        refuses (e.g. the user may not create tables), ``StoreConnectionError`` when it
        cannot be reached."""
        if not self.needs_upgrade:
            return

        async def attempt() -> schema.Layout:
            conn = await pg.connect(self._url, read_only=False)
            try:
                async with conn.transaction():
                    return await schema.migrate(conn, create_cubeloop=False)
            except asyncpg.PostgresError as error:
                if pg.is_connection_error(error):
                    raise
                raise DatabaseOpenError(f"The PostgreSQL database {self._where} cannot be upgraded: {error}.") from None
            finally:
                await conn.close()

        layout = await self._retrying(attempt, "upgrade")
        pool = await self._retrying(lambda: pg.create_pool(self._url, read_only=False), "upgrade")
        old, self._pool, self._layout = self._pool, pool, layout
        if old is not None:
            await old.close()

    # --- state ---------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        """See ``OwnerScoped.owner``: the owner this store was opened for."""
        return self._owner

    @property
    def _scope(self) -> schema.Scope:
        """The owner and schema version every query of this store is written for."""
        return schema.Scope(self._owner, self._layout.version)

    @property
    def where(self) -> str:
        """The database's URL without password, for sentences."""
        return self._where

    @property
    def read_only(self) -> bool:
        """True while writes raise ``ReadOnlyStoreError`` (browse-only)."""
        return self._layout.version != len(schema.MIGRATIONS)

    @property
    def needs_upgrade(self) -> bool:
        """True for a cubeloop database without our tables, or ours at an older version."""
        return (self._layout.version or 0) < len(schema.MIGRATIONS)

    @property
    def schema_version(self) -> int | None:
        """Our schema version in the database, ``None`` when it has none of our tables (cubeloop's)."""
        return self._layout.version

    @property
    def _ours(self) -> bool:
        """Whether our tables exist (the supervision readers have something to read)."""
        return self._layout.version is not None and self._layout.version >= 1

    async def close(self) -> None:
        """Close the pool; idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ------------------------------------------------------------------------

    def _check_writable(self) -> None:
        """Raise ``ReadOnlyStoreError`` (one sentence) unless writes are allowed."""
        if self.read_only:
            raise ReadOnlyStoreError(
                f"The PostgreSQL database {self._where} is open for browsing only; upgrade it before writing to it."
            )

    def _live_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise CheckpointError(f"The store {self._where} is closed.")
        return self._pool

    async def _retrying(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """``call()`` through the reconnect policy; a refusal of our write functions becomes
        its own sentence (:func:`core.checkpoint.postgres_conn.refusal`), any other SQL error
        (not a broken connection) one sentence (``CheckpointError``) naming the call and the server."""
        try:
            return await with_reconnect(
                call,
                what=what,
                where=self._where,
                is_connection_error=pg.is_connection_error,
                on_status=self._on_status,
                delays=self._reconnect_delays,
            )
        except asyncpg.PostgresError as error:
            refused = pg.refusal(error)
            if refused is not None:
                raise refused from None
            raise CheckpointError(f"The {what} on {self._where} failed: {error}.") from None

    async def _read(self, fn: Callable[[Any], Awaitable[T]], what: str) -> T:
        """Run ``fn(conn)`` in one read-only repeatable-read transaction (one snapshot), retried
        on a new connection when the connection breaks."""

        async def attempt() -> T:
            async with (
                self._live_pool().acquire() as conn,
                _dropping_broken(conn),
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                return await fn(conn)

        return await self._retrying(attempt, what)

    async def _write(self, fn: Callable[[Any], Awaitable[T]], what: str, thread_id: str | None) -> T:
        """Run ``fn(conn)`` in one transaction with a write id recorded in it; a retry whose
        id is already there returns that attempt's stored result instead of running again.
        Raises ``ReadOnlyStoreError`` on a browse-only store (nothing sent)."""
        self._check_writable()
        write_id = pg.new_write_id()

        async def attempt() -> T:
            async with self._live_pool().acquire() as conn, _dropping_broken(conn), conn.transaction():
                new, stored = await pg.claim_write(conn, write_id, thread_id)
                if not new:
                    return stored
                result = await fn(conn)
                await pg.store_result(conn, write_id, result)
                if self._before_commit is not None:
                    await self._before_commit(what, conn)
                return result

        return await self._retrying(attempt, what)

    async def _write_call(self, fn: Callable[[Any, str], Awaitable[T]], what: str) -> T:
        """Run ``fn(conn, write_id)``: one statement calling one of our write functions
        (:mod:`core.checkpoint.postgres_schema`, v2), in its own implicit transaction - one
        round trip, where :meth:`_write` costs BEGIN, the write id and COMMIT besides. The
        function claims ``write_id`` itself, so a retry of a write that committed does nothing
        again. Raises ``ReadOnlyStoreError`` on a browse-only store (nothing sent), and the
        refusals of :func:`core.checkpoint.postgres_conn.refusal`."""
        self._check_writable()
        write_id = pg.new_write_id()

        async def attempt() -> T:
            async with self._live_pool().acquire() as conn, _dropping_broken(conn):
                hook = self._before_commit
                if hook is None:
                    return await fn(conn, write_id)
                async with conn.transaction():
                    result = await fn(conn, write_id)
                    await hook(what, conn)
                    return result

        return await self._retrying(attempt, what)

    # --- change notification -------------------------------------------------------------

    async def change_token(self) -> Hashable:
        """See ``ChangeNotification.change_token``: the sum of our 64 change counters, which
        every commit that changed a row raises (our triggers; cubeloop's writes included).

        Without our triggers (browsing a cubeloop database) a costlier token is read, still
        correct: the message and run counts, run completions, and a hash of every thread
        row's extra, pending request and ``updated_at`` and of every answer - one pass over
        cubeloop's tables."""
        if self._ours:
            return await self._read(lambda c: c.fetchval(f"SELECT sum(n) FROM {schema.CHANGES}"), "change check")
        return await self._read(_browse_token, "change check")

    async def change_signals(self, stop: asyncio.Event, *, quiet_ms: int = 50) -> AsyncIterator[None]:
        """See ``ChangeNotification.change_signals``: ``LISTEN cubepi_tui_changes`` on a
        connection of its own (re-established when it drops, through the reconnect policy,
        with one yield after, as changes may have been missed meanwhile). Without our
        triggers it reads the change token every ``BROWSE_POLL`` s and yields when it moved."""
        if not self._ours:
            async for _ in self._poll_signals(stop):
                yield None
            return
        woke = asyncio.Event()
        conn: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                if conn is None or conn.is_closed():
                    again = conn is not None
                    conn = await self._retrying(lambda: self._listen(woke), "change watch")
                    if again:
                        yield None
                if await _wait_either(woke, stop, WATCH_CHECK) and not stop.is_set():
                    await asyncio.sleep(quiet_ms / 1000)
                    woke.clear()
                    yield None
        finally:
            if conn is not None and not conn.is_closed():
                with contextlib.suppress(Exception):
                    await conn.close()

    async def _listen(self, woke: asyncio.Event) -> asyncpg.Connection:
        conn = await pg.connect(self._url, read_only=True)
        try:
            await conn.add_listener(schema.CHANNEL, lambda *_: woke.set())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _poll_signals(self, stop: asyncio.Event) -> AsyncIterator[None]:
        token = await self.change_token()
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), BROWSE_POLL)
            if stop.is_set():
                return
            now = await self.change_token()
            if now != token:
                token = now
                yield None


@contextlib.asynccontextmanager
async def _dropping_broken(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Close a pooled connection whose protocol state broke (``InternalClientError``), so the
    pool opens a new one for the retry instead of handing the broken one out again.

    Seen when ``pg_terminate_backend`` hit an idle pooled connection: the server's FATAL
    arrives unasked, and the next query on that connection fails this way, not as closed.
    """
    try:
        yield
    except asyncpg.InternalClientError:
        conn.terminate()
        raise


async def _wait_either(woke: asyncio.Event, stop: asyncio.Event, timeout: float) -> bool:
    """Wait until ``woke`` or ``stop`` is set or ``timeout`` seconds passed; whether either is set."""
    waits = {asyncio.ensure_future(woke.wait()), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return woke.is_set() or stop.is_set()


async def _browse_token(conn: Any) -> tuple[Any, ...]:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM cubepi_messages) AS messages,"
        " (SELECT count(*)::text || ':' || count(completed_at) FROM cubepi_runs) AS runs,"
        " (SELECT count(*)::text || ':' || coalesce(sum(hashtextextended(extra::text || '|'"
        " || coalesce(pending_request::text, '') || '|' || coalesce(run_id, '') || '|' || updated_at::text, 0)), 0)"
        " FROM cubepi_threads) AS threads,"
        " (SELECT count(*)::text || ':' || coalesce(sum(hashtextextended(answer::text || '|' || answered_at::text, 0)), 0)"
        " FROM cubepi_hitl_answers) AS answers"
    )
    return tuple(row)


async def _create(url: str) -> schema.Layout:
    """cubeloop's tables and ours in one transaction (another creator waits, then finds them)."""
    try:
        conn = await pg.connect(url, read_only=False)
    except Exception as error:
        raise pg.open_error(url, error) from None
    try:
        async with conn.transaction():
            return await schema.migrate(conn, create_cubeloop=True)
    except asyncpg.PostgresError as error:
        raise DatabaseOpenError(
            f"Cannot create the agent tables in the PostgreSQL database {pg.where(url)}: {error}."
        ) from None
    finally:
        await conn.close()


def _check_versions(place: str, layout: schema.Layout) -> None:
    """``SchemaError`` for a cubeloop schema other than v5 or ours newer than this version knows."""
    if not layout.has_cubeloop:
        raise SchemaError(
            f"The PostgreSQL database {place} holds cubepi-tui's tables without cubeloop's, so its threads are missing."
        )
    found = layout.cubeloop_version
    if found is None:
        raise SchemaError(
            f"The PostgreSQL database {place} holds cubeloop's tables without a schema version, so it is not"
            " known how to read them; restore cubepi_schema_version from the migrations that made them."
        )
    if found != schema.CUBELOOP_VERSION:
        newer = "a newer" if found > schema.CUBELOOP_VERSION else "an older"
        raise SchemaError(
            f"The PostgreSQL database {place} holds cubeloop's schema version {found}, from {newer} cubeloop,"
            f" and this cubepi-tui reads only version {schema.CUBELOOP_VERSION}."
        )
    known = len(schema.MIGRATIONS)
    if layout.version is not None and layout.version > known:
        raise SchemaError(
            f"The PostgreSQL database {place} was written by a newer cubepi-tui (schema version {layout.version},"
            f" this one knows up to {known}); update cubepi-tui to open it."
        )
