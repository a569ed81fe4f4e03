"""One open SQLite file: how it was opened (read-write, new, browse-only), its upgrade,
and the retrying one-hop call every store method goes through (a short write runs in place
when the connection is idle: :mod:`core.checkpoint.sqlite_gate`); plus the path checks
and open errors in one sentence.

:class:`SQLiteFile` is the base of :class:`~core.checkpoint.sqlite.SQLiteCheckpointer`,
which adds the store's methods. With :mod:`core.checkpoint.sqlite` this is the only
module that imports the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

import aiosqlite

from core.checkpoint import sqlite_schema as schema
from core.checkpoint.sqlite_gate import NOT_RUN, Gate, call
from core.errors import (
    CheckpointError,
    DatabaseGoneError,
    DatabaseOpenError,
    ReadOnlyStoreError,
    SchemaError,
    StoreBusyError,
)
from core.owners import resolve_owner

T = TypeVar("T")

BUSY_TIMEOUT = 2.0
"""Seconds SQLite's own busy handler waits for another connection's lock within one attempt
(it sleeps 1, 2, 5, 10 ... 100 ms between its own tries)."""

LOCK_WAIT = 60.0
"""Seconds one store call keeps trying while another program holds the database locked,
before it gives up with ``StoreBusyError``. Attempts of up to ``BUSY_TIMEOUT`` s follow
each other after pauses of 0.05 s doubling to at most ``BACKOFF_MAX`` s, and every retry
is reported (``on_busy``), so the app says what it waits for. Why 60 s: a write lock held
by a program doing its work (a migration or ``VACUUM`` of a large file, a backup, a
``BEGIN IMMEDIATE`` typed in the sqlite3 shell and committed a little later) ends well
within it, as does a lease's time to live (15 s by default); a lock held longer is a
program forgotten mid-transaction rather than working, and is then said in one sentence."""

BACKOFF_MAX = 1.0
"""Seconds, at most, between two attempts of a locked call (the pause doubles from 0.05 s)."""


class SQLiteFile:
    """An open SQLite file and its mode; use :meth:`open` (a subclass gets its own type back).

    Every call goes through :meth:`_run`: one hop to aiosqlite's connection thread that
    runs a whole transaction there, retried with backoff while another process holds
    the lock. Writes on a browse-only file are refused by :meth:`_check_writable`.

    The file's identity (``st_dev``, ``st_ino``) is taken when it is opened and compared
    with the path's after every call (one ``stat``, about 2 µs): SQLite goes on writing
    the file it opened after the path was unlinked or renamed over, so without this a run
    would report its writes saved into a file nobody can open again.
    """

    def __init__(
        self,
        db: aiosqlite.Connection,
        path: Path,
        layout: schema.Layout,
        *,
        writable: bool,
        busy_timeout: float,
        lock_wait: float,
        retries: int | None,
        durable: bool,
        on_busy: Callable[[int], None] | None,
        owner: str,
    ) -> None:
        """Internal: use :meth:`open`."""
        self._owner = owner
        self._db: aiosqlite.Connection | None = db
        self._path = path
        self._layout = layout
        self._writable = writable
        self._busy_timeout = busy_timeout
        self._lock_wait = lock_wait
        self._retries = retries
        self._durable = durable
        self._on_busy = on_busy
        self._identity = _identity(path)
        self._lock_waits: list[float] = []  # unix start times of the calls retrying a locked file now
        self._locked_since: float | None = None  # the earliest of them
        self._gate = Gate(busy_timeout)
        self._in_place: bool | None = None  # whether short writes may run in place; known at the first
        self._checkpoint: asyncio.Future[None] | None = None  # the queued WAL checkpoint, while it runs

    # --- opening -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout: float = BUSY_TIMEOUT,
        lock_wait: float = LOCK_WAIT,
        retries: int | None = None,
        durable: bool = False,
        on_busy: Callable[[int], None] | None = None,
        owner: str | None = None,
    ) -> Self:
        """Open the store at ``path`` for ``owner``.

        ``create``: a missing file (or one without tables) is created with the full schema;
        when false a missing file is an error. ``busy_timeout`` (seconds) is how long SQLite
        itself waits for another process's lock in one attempt, and ``lock_wait`` (seconds)
        how long a locked call is retried in all, with backoff (see ``LOCK_WAIT`` for the
        numbers and why); ``retries``, when given, also caps the number of retries.
        ``on_busy(attempt)`` is called before each retry, so an app can show the wait.
        ``durable`` syncs every commit to disk (``synchronous=FULL``, ~10x slower); by default a commit survives a killed process but the last
        ones may be lost on power failure (WAL with ``synchronous=NORMAL``).
        ``owner``: whose threads every call reads and writes (:mod:`core.owners`; ``None``:
        the default owner, :data:`~core.owners.UNOWNED`: the threads that record none).

        Raises ``ValueError`` (one sentence, before the file is touched) for an owner name
        :func:`core.owners.check_owner` refuses; ``DatabaseOpenError`` (one sentence naming the path) for a directory, a
        missing file when ``create`` is false or its directory is not writable, an
        unreadable file, a file that is not SQLite, or a SQLite file with no agent tables;
        ``SchemaError`` for a schema newer than this version knows. A cubeloop file or an
        older schema of ours opens browse-only (``needs_upgrade`` is true).
        """
        settings = {
            "busy_timeout": busy_timeout,
            "lock_wait": lock_wait,
            "retries": retries,
            "durable": durable,
            "on_busy": on_busy,
            "owner": resolve_owner(owner),
        }
        p = Path(path).expanduser().absolute()
        exists = check_path(p, create=create)
        if not exists:
            return await cls._create(p, **settings)
        db, layout = await _read_existing(p, busy_timeout)
        if not layout.columns and create and p.stat().st_size == 0 and writable_place(p):
            # An empty file is an empty database: ours to create (e.g. made by mktemp).
            await db.close()
            return await cls._create(p, **settings)
        if not layout.columns:
            await db.close()
            raise DatabaseOpenError(f"{p} is a SQLite database but holds no agent threads (it has no tables).")
        if layout.version is None and "messages" not in layout.columns and layout.columns:
            await db.close()
            raise DatabaseOpenError(f"{p} is a SQLite database but holds no agent threads (it has no messages table).")
        if layout.version is not None and layout.version > len(schema.MIGRATIONS):
            await db.close()
            raise SchemaError(
                f"{p} was written by a newer cubepi-tui (schema version {layout.version}, "
                f"this one knows up to {len(schema.MIGRATIONS)}); update cubepi-tui to open it."
            )
        if layout.version == len(schema.MIGRATIONS) and writable_place(p):
            await db.close()
            return await cls._open_writable(p, **settings)
        # Foreign, older, or in a place we cannot write: browse through the read-only URI.
        return cls(db, p, layout, writable=False, **settings)

    @classmethod
    async def _create(cls, path: Path, **settings: Any) -> Self:
        db = await connect(path, read_only=False, busy_timeout=settings["busy_timeout"])
        try:
            # No retry loop here: sqlite's busy timeout covers two programs creating at once,
            # and a raw failure must still become the one sentence _open_error writes.
            layout = await call(db, schema.migration(durable=settings["durable"]))
        except BaseException as exc:
            await db.close()
            raise open_error(path, exc) from None
        return cls(db, path, layout, writable=True, **settings)

    @classmethod
    async def _open_writable(cls, path: Path, **settings: Any) -> Self:
        db = await connect(path, read_only=False, busy_timeout=settings["busy_timeout"])
        store = cls(db, path, schema.Layout({}, None), writable=True, **settings)
        try:
            await store._run(lambda c: schema.set_pragmas(c, wal=True, durable=store._durable), "open")
            store._layout = await store._run(schema.read_layout, "open")
        except BaseException as exc:
            await store.close()
            raise open_error(path, exc) from None
        return store

    async def upgrade(self) -> None:
        """Make a browse-only store writable: migrate it in one transaction, then switch to WAL.

        Call only after the user agreed. No existing row is changed; cubeloop can still
        read and write the file afterwards. A no-op on a writable store. Raises
        ``ReadOnlyStoreError`` when the file or its directory cannot be written,
        ``StoreBusyError`` when another process holds the lock past every retry.
        """
        if self._writable:
            return
        if self._db is None:
            raise CheckpointError(f"The store {self._path} is closed.")
        if not writable_place(self._path):
            raise ReadOnlyStoreError(f"{self._path} cannot be upgraded: the file or its directory is not writable.")
        old = self._db
        self._db = await connect(self._path, read_only=False, busy_timeout=self._busy_timeout)
        self._in_place = None
        if old is not None:
            await old.close()
        try:
            await self._migrate()
        except BaseException:
            # Back to browsing: the failed transaction was rolled back, the file is as it was.
            await self._db.close()
            self._db = await connect(self._path, read_only=True, busy_timeout=self._busy_timeout)
            raise
        self._writable = True

    async def _migrate(self) -> None:
        self._layout = await self._run(schema.migration(durable=self._durable), "upgrade")

    # --- state ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The database file (absolute)."""
        return self._path

    @property
    def owner(self) -> str:
        """See ``OwnerScoped.owner``: the owner this store was opened for."""
        return self._owner

    @property
    def locked_since(self) -> float | None:
        """Unix seconds since which another program has kept this database write-locked, as
        far as this store saw: when the earliest of its calls still retrying a locked file
        was made (each of its attempts since was refused), or ``None`` when none is.

        A fenced write reads it inside its transaction (on the connection thread), so the
        time a lease lost to the lock is given back (:func:`core.checkpoint.base.lock_wait_credit`).
        """
        return self._locked_since

    @property
    def needs_upgrade(self) -> bool:
        """True for a cubeloop file or an older schema of ours, opened browse-only."""
        return not self._writable and (self._layout.version or 0) < len(schema.MIGRATIONS)

    @property
    def upgrade_explanation(self) -> str:
        """What :meth:`upgrade` does to this file, for the question asked before it (see
        ``SchemaUpgrade.upgrade_explanation``)."""
        return (
            "This database was written by another program (cubeloop) or an older version and is open "
            "for browsing only. To write to it, cubepi-tui adds its own tables beside the existing ones "
            "(and triggers that give each new thread a record there) and switches the file to WAL "
            "journaling; no existing row is changed and cubeloop can still "
            "read and write it. Its threads stay without an owner: --unowned opens them. Upgrade now?"
        )

    @property
    def read_only(self) -> bool:
        """True while writes raise ``ReadOnlyStoreError`` (browse-only or an unwritable place)."""
        return not self._writable

    @property
    def schema_version(self) -> int | None:
        """Our schema version in the file, ``None`` for a file we never migrated (cubeloop's)."""
        return self._layout.version

    def check_file(self) -> None:
        """Raise ``DatabaseGoneError`` (one sentence naming the path) when the file this store
        opened is no longer at its path: deleted, moved away, or replaced by another file.
        Every call checks this itself; call it to learn before reporting work as saved."""
        now = _identity(self._path)
        if self._identity is None:
            self._identity = now  # opened before SQLite created the file: take it now
            return
        if now == self._identity:
            return
        how = "deleted (or moved away)" if now is None else "replaced by another file"
        raise DatabaseGoneError(
            f"{self._path} was {how} while this program had it open, so nothing more can be read from or saved to it."
        )

    async def close(self) -> None:
        """Close the connection; idempotent. In WAL mode the last close folds the -wal back.

        When the file was replaced or deleted under us, our WAL is first emptied (``PRAGMA
        wal_checkpoint(TRUNCATE)``, which folds it into the file we opened and truncates the
        WAL file our connection holds): SQLite finds a WAL by the database's *path*, so a
        WAL of ours left there would be replayed into the file now at that path by the next
        program to open it, overwriting that file's own pages ("How To Corrupt An SQLite
        Database File", https://sqlite.org/howtocorrupt.html, section 2: a file unlinked or
        renamed over while open)."""
        db, self._db = self._db, None
        if db is None:
            return
        if self._checkpoint is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint
        if self._identity is not None and _identity(self._path) != self._identity:
            with contextlib.suppress(sqlite3.Error):
                await self._gate.queued(db, lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        await db.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ------------------------------------------------------------------------

    def _check_writable(self) -> None:
        """Raise ``ReadOnlyStoreError`` (why, in one sentence) unless writes are allowed."""
        if self._writable:
            return
        if self.needs_upgrade:
            raise ReadOnlyStoreError(f"{self._path} is open for browsing only; upgrade it before writing to it.")
        raise ReadOnlyStoreError(f"{self._path} is read-only: the file or its directory cannot be written.")

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn`` on the connection thread; retry "database is locked" with backoff.

        Raises ``DatabaseGoneError`` after the call when the file is no longer at its path
        (see :meth:`check_file`): a write then went into a file nobody can open again.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        called_at = time.time()
        delay = 0.05
        attempt = 0
        try:
            while True:
                db = self._db
                if db is None:
                    raise CheckpointError(f"The store {self._path} is closed.")
                try:
                    result = await self._gate.queued(db, fn)
                    self.check_file()
                    return result
                except sqlite3.Error as exc:
                    self.check_file()
                    waited = loop.time() - started
                    out_of_time = waited + delay + self._busy_timeout > self._lock_wait
                    out_of_tries = self._retries is not None and attempt >= self._retries
                    if not is_busy(exc) or out_of_time or out_of_tries:
                        raise call_error(self._path, exc, what, waited=waited, read_only=self.read_only) from None
                if attempt == 0:
                    self._waiting(called_at, True)
                attempt += 1
                if self._on_busy is not None:
                    self._on_busy(attempt)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
        finally:
            if attempt:
                self._waiting(called_at, False)

    async def _run_short(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """:meth:`_run` for a write of a few statements (an append, a journal entry): run in
        place on the caller's thread when the connection is idle (:mod:`core.checkpoint.sqlite_gate`:
        two thread wake-ups cost more than the write), else queued as every call is.

        In place only on a WAL file with ``synchronous=NORMAL`` (a commit then writes the
        WAL without an fsync; ``durable`` syncs every commit) and outside a wait for another
        program's lock. A file locked by another connection sends the call to the queue,
        which waits and retries; other errors are :meth:`_run`'s."""
        db = self._db
        if self._in_place is None and db is not None:
            self._in_place = not self._durable and self._writable and await self._run(_is_wal, "open")
        if db is not None and self._in_place and not self._lock_waits and db is self._db:
            try:
                result = self._gate.in_place(db, fn)
            except sqlite3.Error as exc:
                self.check_file()
                if not is_busy(exc):
                    raise call_error(self._path, exc, what, waited=0.0, read_only=self.read_only) from None
                result = NOT_RUN
            if result is not NOT_RUN:
                self.check_file()
                if self._gate.checkpoint_due and self._checkpoint is None:
                    self._checkpoint = asyncio.ensure_future(self._run_checkpoint())
                await asyncio.sleep(0)  # a caller writing in a loop still lets other tasks run
                return result
        return await self._run(fn, what)

    async def _run_checkpoint(self) -> None:
        """A passive WAL checkpoint on the connection thread, for the writes run in place
        (:mod:`core.checkpoint.sqlite_gate`). One that fails changes nothing: SQLite
        checkpoints at a later commit, or the next one here does."""
        log_frames = backfilled = 0
        try:
            with contextlib.suppress(CheckpointError, sqlite3.Error):
                _, log_frames, backfilled = await self._run(
                    lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone(), "checkpoint"
                )
        finally:
            self._gate.checkpointed(log_frames, backfilled)
            self._checkpoint = None

    def _waiting(self, called_at: float, start: bool) -> None:
        # Only the event loop's thread changes the list; the connection thread reads the
        # one attribute (locked_since), which is replaced whole.
        if start:
            self._lock_waits.append(called_at)
        else:
            self._lock_waits.remove(called_at)
        self._locked_since = min(self._lock_waits, default=None)


# --- connection, paths, errors -----------------------------------------------------------------


async def connect(path: Path, *, read_only: bool, busy_timeout: float, immutable: bool = False) -> aiosqlite.Connection:
    """An aiosqlite connection in autocommit mode (we issue BEGIN/COMMIT ourselves).

    Read-only uses the ``mode=ro`` URI: SQLite then never writes the file, its journal, or
    creates a -wal beside a rollback-journal database. ``immutable`` adds SQLite's
    ``immutable=1``: no locks and no -shm, the only way to read a WAL file on read-only
    media (https://www.sqlite.org/uri.html#uriimmutable).
    """
    query = "mode=ro&immutable=1" if immutable else "mode=ro"
    target = f"file:{urllib.parse.quote(str(path))}?{query}" if read_only else str(path)
    try:
        # check_same_thread: a short write may run on the caller's thread (sqlite_gate), never
        # at the same time as a call on the connection's own thread.
        db = await aiosqlite.connect(
            target, uri=read_only, isolation_level=None, timeout=busy_timeout, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise open_error(path, exc) from None
    return db


async def _read_existing(path: Path, busy_timeout: float) -> tuple[aiosqlite.Connection, schema.Layout]:
    """Open an existing file read-only and read its layout.

    A WAL file in a place we cannot write (a read-only mount) cannot be opened plainly -
    SQLite would need to create its -shm - so it is read as immutable instead: nobody
    can be writing it there.
    """
    db = await connect(path, read_only=True, busy_timeout=busy_timeout)
    try:
        return db, await call(db, schema.read_layout)
    except BaseException as exc:
        await db.close()
        if not (isinstance(exc, sqlite3.OperationalError) and not writable_place(path)):
            raise open_error(path, exc) from None
    db = await connect(path, read_only=True, busy_timeout=busy_timeout, immutable=True)
    try:
        return db, await call(db, schema.read_layout)
    except BaseException as exc:
        await db.close()
        raise open_error(path, exc) from None


def _is_wal(c: sqlite3.Connection) -> bool:
    """Whether the file is in WAL mode (``PRAGMA journal_mode``)."""
    return str(c.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"


def _identity(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path``, ``None`` when there is none. Never raises."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "locked"/"busy" error (SQLITE_BUSY, SQLITE_LOCKED), which
    the store retries. Matched on the message, the one part every path to it keeps (this
    Python's ``sqlite3.Error`` has no ``sqlite_errorcode``). Never raises."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


def check_path(path: Path, *, create: bool) -> bool:
    """Whether ``path`` exists; raises ``DatabaseOpenError`` for every path we cannot use."""
    try:
        return _check_path_parts(path, create=create)
    except OSError as exc:  # e.g. a parent directory we may not enter
        raise DatabaseOpenError(f"{path} cannot be reached: {(exc.strerror or str(exc)).lower()}.") from None


def _check_path_parts(path: Path, *, create: bool) -> bool:
    if path.is_dir():
        raise DatabaseOpenError(f"{path} is a directory, not a database file.")
    if path.exists():
        if not os.access(path, os.R_OK):
            raise DatabaseOpenError(f"{path} cannot be read: permission denied.")
        return True
    if not create:
        raise DatabaseOpenError(f"{path} does not exist.")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise DatabaseOpenError(f"Cannot create {path}: {parent} {what}.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DatabaseOpenError(f"Cannot create {path}: the directory {parent} is not writable.")
    return False


def writable_place(path: Path) -> bool:
    """Whether this process may write ``path`` and create files beside it. Never raises."""
    # WAL needs to create -wal and -shm beside the file, so the directory must be writable too.
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def open_error(path: Path, exc: BaseException) -> BaseException:
    """One sentence for a failure while opening; our own errors pass through unchanged."""
    if isinstance(exc, CheckpointError) or not isinstance(exc, sqlite3.Error):
        return exc
    text = str(exc).lower()
    if "not a database" in text:
        return DatabaseOpenError(f"{path} is not a SQLite database.")
    if "malformed" in text:
        return DatabaseOpenError(f"{path} is a damaged SQLite database (its disk image is malformed).")
    if is_busy(exc):
        return StoreBusyError(f"{path} is locked by another program; try again when it is done.")
    if "readonly" in text and has_hot_journal(path):
        return hot_journal_error(path)
    if "unable to open" in text or "readonly" in text:
        if not path.exists():
            return DatabaseOpenError(f"Cannot create {path}: the directory {path.parent} is not writable.")
        return DatabaseOpenError(f"{path} cannot be opened: {exc}.")
    return DatabaseOpenError(f"{path} cannot be opened: {exc}.")


def has_hot_journal(path: Path) -> bool:
    """Whether a rollback journal (``<path>-journal``) sits beside ``path``: a writer in
    rollback-journal mode stopped mid-transaction (or is writing now). Never raises."""
    return Path(f"{path}-journal").exists()


def hot_journal_error(path: Path) -> DatabaseOpenError:
    """The one-sentence error (returned, not raised) for browsing a file with a hot journal."""
    # A writer died mid-transaction: reading needs SQLite to roll its journal back, which
    # changes the file, and browsing never changes a file; a read-write open does it.
    return DatabaseOpenError(
        f"{path} holds an unfinished write of a program that stopped mid-transaction; open it once"
        " with cubeloop or the sqlite3 shell to roll that write back, as browsing never changes the file."
    )


def call_error(path: Path, exc: sqlite3.Error, what: str, *, waited: float, read_only: bool) -> CheckpointError:
    """One sentence for a failed call: ``what`` names it ("append", "lease", ...), ``waited`` is seconds."""
    text = str(exc).lower()
    if is_busy(exc):
        # Nothing was done and the same call works once the lock is gone: say that, not
        # which internal step ("lease", "append") happened to be the one refused.
        return StoreBusyError(
            f"The database {path} stayed locked by another program for {waited:.0f} s; try again when it is free."
        )
    if "readonly" in text and read_only and has_hot_journal(path):
        return hot_journal_error(path)
    if "readonly" in text or "read-only" in text:
        return ReadOnlyStoreError(f"{path} cannot be written: the file or its directory is read-only.")
    return CheckpointError(f"The {what} on {path} failed: {exc}.")
