"""SQLite checkpointer on aiosqlite, sharing its tables with cubeloop.

The file holds cubeloop's tables (``messages``, ``thread_extra``, ``runs``,
``thread_pending_request``, ``thread_hitl_answers``) exactly as cubeloop creates them,
so either program opens the other's files, plus our own beside them: ``cubepi_schema``
(the schema version) and an index on ``messages(thread_id, id)``.

How a file is opened depends on what it is (see :meth:`SQLiteCheckpointer.open`):

* ours, at the version this module knows: read-write, WAL, short transactions;
* new (missing or without tables) and creating is allowed: created with the full schema;
* foreign (cubeloop's: no ``cubepi_schema``) or an older version of ours: **browse-only**
  through a read-only URI, so its bytes never change; :meth:`~SQLiteCheckpointer.upgrade`
  migrates it in one transaction once the user agrees;
* newer than this module knows: :class:`~core.errors.SchemaError`.

Every public call is one hop to aiosqlite's connection thread that runs a whole
transaction there, so a call never leaves a transaction open and never interleaves with
another call. Decoding happens on that thread too, one row per validator call, so the
event loop keeps getting the GIL during long loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import aiosqlite

from core.checkpoint import codec
from core.checkpoint.base import CheckpointData, CorruptRow, RunRecord, ThreadSummary
from core.errors import (
    CheckpointError,
    CorruptRecordError,
    DatabaseOpenError,
    ReadOnlyStoreError,
    RunAlreadyClaimedError,
    RunAlreadyCompletedError,
    RunNotClaimedError,
    SchemaError,
    StoreBusyError,
)
from core.messages import AnyMessage, AssistantMessage, UserMessage

T = TypeVar("T")

# --- schema ------------------------------------------------------------------------------

_CUBELOOP_TABLES = (
    "CREATE TABLE IF NOT EXISTS messages (  id INTEGER PRIMARY KEY AUTOINCREMENT,  thread_id TEXT NOT NULL,"
    "  message_json TEXT NOT NULL,  created_at REAL NOT NULL DEFAULT (julianday('now')), run_id TEXT)",
    "CREATE TABLE IF NOT EXISTS thread_extra (  thread_id TEXT PRIMARY KEY,"
    "  extra_json TEXT NOT NULL DEFAULT '{}', parent_thread_id TEXT)",
    "CREATE TABLE IF NOT EXISTS thread_pending_request (  thread_id TEXT PRIMARY KEY,  request_json TEXT NOT NULL,"
    "  run_id TEXT,  created_at REAL NOT NULL DEFAULT (julianday('now')))",
    "CREATE TABLE IF NOT EXISTS thread_hitl_answers (  thread_id TEXT NOT NULL,  run_id TEXT NOT NULL,"
    "  question_id TEXT NOT NULL,  answer_json TEXT NOT NULL,  answered_at REAL NOT NULL DEFAULT (julianday('now')),"
    "  PRIMARY KEY (thread_id, run_id, question_id))",
    "CREATE TABLE IF NOT EXISTS runs (  thread_id TEXT NOT NULL,  run_id TEXT NOT NULL,"
    "  claimed_at REAL NOT NULL DEFAULT (julianday('now')),  completed_at REAL,  completion_seq INTEGER,"
    "  PRIMARY KEY (thread_id, run_id))",
    "CREATE INDEX IF NOT EXISTS ix_runs_thread_completion ON runs (thread_id, completion_seq)",
)
# Columns older cubeloop releases created without (cubeloop adds them with ALTER on open).
_CUBELOOP_LATE_COLUMNS = (
    ("messages", "run_id", "TEXT"),
    ("thread_extra", "parent_thread_id", "TEXT"),
    ("thread_pending_request", "run_id", "TEXT"),
)
SCHEMA_TABLE = "cubepi_schema"


def _v1_cubeloop_tables_and_thread_index(db: sqlite3.Connection) -> None:
    """cubeloop's tables (created or completed), the thread index, the schema-version table."""
    for ddl in _CUBELOOP_TABLES:
        db.execute(ddl)
    for table, column, kind in _CUBELOOP_LATE_COLUMNS:
        if column not in _columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    # Loads and thread listings walk one thread in id order; cubeloop has no such index.
    db.execute("CREATE INDEX IF NOT EXISTS ix_messages_thread_id ON messages (thread_id, id)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER NOT NULL)")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_cubeloop_tables_and_thread_index,
]
"""Ordered migrations: applying ``MIGRATIONS[i]`` brings a file to schema version ``i + 1``.

Each takes a ``sqlite3.Connection`` inside an open transaction and must be safe to run on
a cubeloop file (create if missing, never rewrite a row). Append only; never reorder."""

# --- tuning ------------------------------------------------------------------------------

FIRST_PROMPT_CHARS = 200
"""``ThreadSummary.first_prompt`` is cut to this many characters (whitespace collapsed)."""
_TAIL_WINDOW = 8  # rows per thread fetched for the tail; a turn rarely has more after its reply
_JD_UNIX_EPOCH = 2440587.5


def julianday_to_unix(jd: float | None) -> float | None:
    """Convert a SQLite ``julianday()`` REAL (days) to unix seconds; ``None`` stays ``None``."""
    return None if jd is None else (jd - _JD_UNIX_EPOCH) * 86400.0


# --- the store ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """What the open file holds: tables and their columns (browse mode tolerates missing ones)."""

    columns: dict[str, frozenset[str]]
    version: int | None

    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.columns.get(table)
        return cols is not None and (column is None or column in cols)


class SQLiteCheckpointer:
    """A :class:`~core.checkpoint.base.Checkpointer` stored in one SQLite file.

    Build it with ``await SQLiteCheckpointer.open(path, create=...)``; it is also an async
    context manager that closes itself. All methods may raise ``StoreBusyError`` (another
    process kept the file locked past every retry) and, for writes on a browse-only store,
    ``ReadOnlyStoreError``. Times returned are unix seconds.
    """

    def __init__(self, db: aiosqlite.Connection, path: Path, layout: _Layout, *, writable: bool,
                 busy_timeout: float, retries: int, durable: bool,
                 on_busy: Callable[[int], None] | None) -> None:
        """Internal: use :meth:`open`."""
        self._db: aiosqlite.Connection | None = db
        self._path = path
        self._layout = layout
        self._writable = writable
        self._busy_timeout = busy_timeout
        self._retries = retries
        self._durable = durable
        self._on_busy = on_busy

    # --- opening -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout: float = 2.0,
        retries: int = 4,
        durable: bool = False,
        on_busy: Callable[[int], None] | None = None,
    ) -> SQLiteCheckpointer:
        """Open the store at ``path``.

        ``create``: a missing file (or one without tables) is created with the full schema;
        when false a missing file is an error. ``busy_timeout`` (seconds) is how long SQLite
        itself waits for another process's lock, and ``retries`` how many more times a
        locked call is retried with backoff (``on_busy(attempt)`` is called before each, so
        an app can show the wait). ``durable`` syncs every commit to disk (``synchronous=
        FULL``, ~10x slower); by default a commit survives a killed process but the last
        ones may be lost on power failure (WAL with ``synchronous=NORMAL``).

        Raises ``DatabaseOpenError`` (one sentence naming the path) for a directory, a
        missing file when ``create`` is false or its directory is not writable, an
        unreadable file, a file that is not SQLite, or a SQLite file with no agent tables;
        ``SchemaError`` for a schema newer than this version knows. A cubeloop file or an
        older schema of ours opens browse-only (``needs_upgrade`` is true).
        """
        p = Path(path).expanduser().absolute()
        exists = _check_path(p, create=create)
        settings = dict(busy_timeout=busy_timeout, retries=retries, durable=durable, on_busy=on_busy)
        if not exists:
            return await cls._create(p, **settings)
        db = await _connect(p, read_only=True, busy_timeout=busy_timeout)
        try:
            layout = await _call(db, _read_layout)
        except BaseException as exc:
            await db.close()
            raise _open_error(p, exc) from None
        if not layout.columns and create:
            await db.close()
            return await cls._create(p, **settings)
        if layout.version is None and "messages" not in layout.columns and layout.columns:
            await db.close()
            raise DatabaseOpenError(f"{p} is a SQLite database but holds no agent threads (it has no messages table).")
        if layout.version is not None and layout.version > len(MIGRATIONS):
            await db.close()
            raise SchemaError(
                f"{p} was written by a newer cubepi-tui (schema version {layout.version}, "
                f"this one knows up to {len(MIGRATIONS)}); update cubepi-tui to open it."
            )
        if layout.version == len(MIGRATIONS) and _writable_place(p):
            await db.close()
            return await cls._open_writable(p, **settings)
        # Foreign, older, or in a place we cannot write: browse through the read-only URI.
        return cls(db, p, layout, writable=False, **settings)

    @classmethod
    async def _create(cls, path: Path, **settings: Any) -> SQLiteCheckpointer:
        db = await _connect(path, read_only=False, busy_timeout=settings["busy_timeout"])
        try:
            # No retry loop here: sqlite's busy timeout covers two programs creating at once,
            # and a raw failure must still become the one sentence _open_error writes.
            layout = await _call(db, _migration(durable=settings["durable"]))
        except BaseException as exc:
            await db.close()
            raise _open_error(path, exc) from None
        return cls(db, path, layout, writable=True, **settings)

    @classmethod
    async def _open_writable(cls, path: Path, **settings: Any) -> SQLiteCheckpointer:
        db = await _connect(path, read_only=False, busy_timeout=settings["busy_timeout"])
        store = cls(db, path, _Layout({}, None), writable=True, **settings)
        try:
            await store._run(lambda c: _set_pragmas(c, wal=True, durable=store._durable), "open")
            store._layout = await store._run(_read_layout, "open")
        except BaseException as exc:
            await store.close()
            raise _open_error(path, exc) from None
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
        if not _writable_place(self._path):
            raise ReadOnlyStoreError(f"{self._path} cannot be upgraded: the file or its directory is not writable.")
        old = self._db
        self._db = await _connect(self._path, read_only=False, busy_timeout=self._busy_timeout)
        if old is not None:
            await old.close()
        try:
            await self._migrate()
        except BaseException:
            # Back to browsing: the failed transaction was rolled back, the file is as it was.
            await self._db.close()
            self._db = await _connect(self._path, read_only=True, busy_timeout=self._busy_timeout)
            raise
        self._writable = True

    async def _migrate(self) -> None:
        self._layout = await self._run(_migration(durable=self._durable), "upgrade")

    # --- state ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The database file (absolute)."""
        return self._path

    @property
    def needs_upgrade(self) -> bool:
        """True for a cubeloop file or an older schema of ours, opened browse-only."""
        return not self._writable and (self._layout.version or 0) < len(MIGRATIONS)

    @property
    def read_only(self) -> bool:
        """True while writes raise ``ReadOnlyStoreError`` (browse-only or an unwritable place)."""
        return not self._writable

    @property
    def schema_version(self) -> int | None:
        """Our schema version in the file, ``None`` for a file we never migrated (cubeloop's)."""
        return self._layout.version

    async def close(self) -> None:
        """Close the connection; idempotent. In WAL mode the last close folds the -wal back."""
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    async def __aenter__(self) -> SQLiteCheckpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the contract --------------------------------------------------------------------

    async def load(self, thread_id: str) -> CheckpointData | None:
        """See ``Checkpointer.load``: messages in row-id order, undecodable rows in ``problems``."""
        layout = self._layout

        def load(c: sqlite3.Connection) -> CheckpointData | None:
            with _read_txn(c):
                rows = c.execute(
                    "SELECT id, CAST(message_json AS BLOB) FROM messages WHERE thread_id = ? ORDER BY id",
                    (thread_id,),
                ).fetchall() if layout.has("messages") else []
                extra_row = None
                if layout.has("thread_extra"):
                    parent = "parent_thread_id" if layout.has("thread_extra", "parent_thread_id") else "NULL"
                    extra_row = c.execute(
                        f"SELECT extra_json, {parent} FROM thread_extra WHERE thread_id = ?", (thread_id,)
                    ).fetchone()
                runs = [run for _, run in _runs_of(c, layout, thread_id)]
            if not rows and extra_row is None and not runs:
                return None
            data = CheckpointData(runs=runs)
            data.messages, data.message_ids, data.problems = _decode_rows(rows, thread_id)
            if extra_row is not None:
                data.parent_thread_id = extra_row[1]
                data.extra, problem = _parse_extra(extra_row[0], thread_id)
                if problem is not None:
                    data.problems.append(problem)
            return data

        return await self._run(load, "load")

    async def append(self, thread_id: str, messages: Sequence[AnyMessage]) -> None:
        """See ``Checkpointer.append``: one transaction; ``created_at`` is the insert time."""
        if not messages:
            return
        self._check_writable()
        rows = [(thread_id, codec.encode(m), getattr(m, "run_id", None)) for m in messages]
        run_ids = sorted({r[2] for r in rows if r[2] is not None})

        def append(c: sqlite3.Connection) -> None:
            with _write_txn(c):
                if run_ids:
                    marks = ",".join("?" * len(run_ids))
                    done = c.execute(
                        f"SELECT run_id FROM runs WHERE thread_id = ? AND run_id IN ({marks})"
                        " AND completed_at IS NOT NULL",
                        (thread_id, *run_ids),
                    ).fetchall()
                    if done:
                        raise RunAlreadyCompletedError(
                            f"Run {done[0][0]} of thread {thread_id!r} is already completed, so nothing was appended."
                        )
                c.executemany("INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)", rows)

        await self._run(append, "append")

    async def save_extra(self, thread_id: str, extra: dict[str, Any]) -> None:
        """See ``Checkpointer.save_extra``: read, merge and write inside one ``BEGIN IMMEDIATE``.

        Raises ``TypeError`` for values JSON cannot hold and ``CorruptRecordError`` when the
        stored extra is not a JSON object (it is left unchanged rather than overwritten).
        """
        self._check_writable()
        patch = json.loads(codec.encode_extra(extra))  # the copy in; fails early on bad values

        def save(c: sqlite3.Connection) -> None:
            with _write_txn(c):
                row = c.execute("SELECT extra_json FROM thread_extra WHERE thread_id = ?", (thread_id,)).fetchone()
                if row is None:
                    c.execute(
                        "INSERT INTO thread_extra (thread_id, extra_json) VALUES (?, ?)",
                        (thread_id, codec.encode_extra(patch)),
                    )
                    return
                current, problem = _parse_extra(row[0], thread_id)
                if problem is not None:
                    raise CorruptRecordError(
                        f"The extra data of thread {thread_id!r} is not a JSON object, so it was left"
                        " unchanged and the new keys were not saved.",
                        thread_id=thread_id,
                        row_id="thread_extra",
                    )
                current.update(patch)
                c.execute(
                    "UPDATE thread_extra SET extra_json = ? WHERE thread_id = ?",
                    (codec.encode_extra(current), thread_id),
                )

        await self._run(save, "save")

    async def claim_run(self, thread_id: str, run_id: str) -> None:
        """See ``Checkpointer.claim_run``; ``claimed_at`` is stored as ``julianday('now')``."""
        self._check_writable()

        def claim(c: sqlite3.Connection) -> None:
            with _write_txn(c):
                row = c.execute(
                    "SELECT completed_at FROM runs WHERE thread_id = ? AND run_id = ?", (thread_id, run_id)
                ).fetchone()
                if row is not None:
                    if row[0] is not None:
                        raise RunAlreadyCompletedError(f"Run {run_id} of thread {thread_id!r} already completed.")
                    raise RunAlreadyClaimedError(f"Run {run_id} of thread {thread_id!r} is already running.")
                c.execute("INSERT INTO runs (thread_id, run_id) VALUES (?, ?)", (thread_id, run_id))

        await self._run(claim, "claim")

    async def mark_run_complete(self, thread_id: str, run_id: str) -> None:
        """See ``Checkpointer.mark_run_complete``: ``completion_seq`` is the thread's next number."""
        self._check_writable()

        def complete(c: sqlite3.Connection) -> None:
            with _write_txn(c):
                row = c.execute(
                    "SELECT completed_at FROM runs WHERE thread_id = ? AND run_id = ?", (thread_id, run_id)
                ).fetchone()
                if row is None:
                    raise RunNotClaimedError(f"Run {run_id} of thread {thread_id!r} was never claimed.")
                if row[0] is not None:
                    return
                c.execute(
                    "UPDATE runs SET completed_at = julianday('now'), completion_seq ="
                    " (SELECT COALESCE(MAX(completion_seq), 0) + 1 FROM runs WHERE thread_id = ?)"
                    " WHERE thread_id = ? AND run_id = ?",
                    (thread_id, thread_id, run_id),
                )

        await self._run(complete, "completion")

    async def list_threads(self) -> list[ThreadSummary]:
        """See ``Checkpointer.list_threads``: a handful of queries, whatever the number of threads.

        Decodes only each thread's tail and first message; corrupt rows never break it.
        """
        layout = self._layout
        return await self._run(lambda c: _list_threads(c, layout), "listing")

    # --- plumbing ------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._writable:
            return
        if self.needs_upgrade:
            raise ReadOnlyStoreError(f"{self._path} is open for browsing only; upgrade it before writing to it.")
        raise ReadOnlyStoreError(f"{self._path} is read-only: the file or its directory cannot be written.")

    async def _run(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn`` on the connection thread; retry "database is locked" with backoff."""
        delay = 0.05
        for attempt in range(self._retries + 1):
            db = self._db
            if db is None:
                raise CheckpointError(f"The store {self._path} is closed.")
            try:
                return await _call(db, fn)
            except sqlite3.Error as exc:
                if not _is_busy(exc) or attempt == self._retries:
                    raise self._translate(exc, what) from None
            if self._on_busy is not None:
                self._on_busy(attempt + 1)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _translate(self, exc: sqlite3.Error, what: str) -> CheckpointError:
        text = str(exc).lower()
        if _is_busy(exc):
            waited = (self._retries + 1) * self._busy_timeout
            return StoreBusyError(
                f"{self._path} stayed locked by another program for about {waited:.0f} s, so the {what} did not happen."
            )
        if "readonly" in text and self.read_only and _has_hot_journal(self._path):
            return _hot_journal_error(self._path)
        if "readonly" in text or "read-only" in text:
            return ReadOnlyStoreError(f"{self._path} cannot be written: the file or its directory is read-only.")
        return CheckpointError(f"The {what} on {self._path} failed: {exc}.")


# --- helpers run on the connection thread ---------------------------------------------------


class _read_txn:
    """A read transaction for one call: one snapshot, closed before the call returns."""

    def __init__(self, c: sqlite3.Connection) -> None:
        self.c = c

    def __enter__(self) -> None:
        self.c.execute("BEGIN")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.c.execute("COMMIT")
        else:
            self.c.rollback()


class _write_txn(_read_txn):
    """``BEGIN IMMEDIATE``: take the write lock first, so a read never has to be upgraded."""

    def __enter__(self) -> None:
        self.c.execute("BEGIN IMMEDIATE")


def _decode_rows(rows: Sequence[tuple[int, bytes]], thread_id: str) -> tuple[list[AnyMessage], list[int], list[CorruptRow]]:
    """Decode ``(id, raw)`` rows one by one; a row that fails becomes a ``CorruptRow``.

    One validator call per row: measured as fast as one call per batch of rows, and a
    batch joined with commas could let two malformed rows read as one valid message.
    """
    messages: list[AnyMessage] = []
    ids: list[int] = []
    problems: list[CorruptRow] = []
    with _gc_paused():
        for row_id, raw in rows:
            try:
                messages.append(codec.decode(raw, thread_id=thread_id, row_id=row_id))
            except CorruptRecordError as exc:
                problems.append(CorruptRow(row_id, str(exc), raw.decode("utf-8", "replace")))
            else:
                ids.append(row_id)
    return messages, ids, problems


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while decoding.

    Decoding allocates many small containers, which triggers collections that walk every
    live object of the process again and again (measured: 10,000 messages decode in ~115 ms
    with the collector paused against ~390 ms without). Decoded messages hold no cycles,
    so nothing is lost by collecting once afterwards instead.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_extra(text: str | None, thread_id: str) -> tuple[dict[str, Any], CorruptRow | None]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value, None
    reason = f"The extra data of thread {thread_id!r} is not a JSON object; it is shown raw and left unchanged."
    return {}, CorruptRow("thread_extra", reason, str(text))


def _runs_of(c: sqlite3.Connection, layout: _Layout, thread_id: str | None) -> list[tuple[str, RunRecord]]:
    """``(thread_id, run)`` pairs in claim order (rowid), of one thread or, with ``None``, of all."""
    if not layout.has("runs"):
        return []
    sql = "SELECT thread_id, run_id, claimed_at, completed_at, completion_seq FROM runs"
    args: tuple[str, ...] = ()
    if thread_id is not None:
        sql, args = sql + " WHERE thread_id = ?", (thread_id,)
    return [
        (tid, RunRecord(run_id, julianday_to_unix(claimed), julianday_to_unix(completed), seq))
        for tid, run_id, claimed, completed, seq in c.execute(sql + " ORDER BY rowid", args)
    ]


def _list_threads(c: sqlite3.Connection, layout: _Layout) -> list[ThreadSummary]:
    stats: dict[str, tuple[int, int, int, float | None]] = {}
    tails: dict[str, list[tuple[int, bytes]]] = {}
    firsts: dict[str, tuple[int, bytes]] = {}
    with _read_txn(c):
        if layout.has("messages"):
            for tid, count, first_id, last_id, last_at in c.execute(
                "SELECT s.thread_id, s.n, s.first_id, s.last_id, m.created_at FROM"
                " (SELECT thread_id, COUNT(*) AS n, MIN(id) AS first_id, MAX(id) AS last_id"
                "  FROM messages GROUP BY thread_id) AS s JOIN messages AS m ON m.id = s.last_id"
            ):
                stats[tid] = (count, first_id, last_id, julianday_to_unix(last_at))
            # The last few rows of every thread in one query: numbering runs on (thread_id, id)
            # only, so the JSON of older rows is never read.
            for row_id, tid, raw in c.execute(
                "SELECT id, thread_id, CAST(message_json AS BLOB) FROM messages WHERE id IN"
                " (SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY thread_id ORDER BY id DESC) AS rn"
                "  FROM messages) WHERE rn <= ?) ORDER BY id",
                (_TAIL_WINDOW,),
            ):
                tails.setdefault(tid, []).append((row_id, raw))
            first_ids = json.dumps([s[1] for s in stats.values()])
            for row_id, tid, raw in c.execute(
                "SELECT id, thread_id, CAST(message_json AS BLOB) FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                (first_ids,),
            ):
                firsts[tid] = (row_id, raw)
        runs: dict[str, list[RunRecord]] = {}
        for tid, run in _runs_of(c, layout, None):
            runs.setdefault(tid, []).append(run)
        extra_ids = [r[0] for r in c.execute("SELECT thread_id FROM thread_extra")] if layout.has("thread_extra") else []

        out: list[ThreadSummary] = []
        for tid in {**dict.fromkeys(stats), **dict.fromkeys(runs), **dict.fromkeys(extra_ids)}:
            count, first_id, _, last_at = stats.get(tid, (0, 0, 0, None))
            tail, problems = _tail_of(c, tid, tails.get(tid, []), count)
            thread_runs = runs.get(tid, [])
            times = [t for t in (last_at, *(r.claimed_at for r in thread_runs), *(r.completed_at for r in thread_runs))
                     if t is not None]
            out.append(
                ThreadSummary(
                    thread_id=tid,
                    message_count=count,
                    last_activity=max(times) if times else None,
                    runs=tuple(thread_runs),
                    tail=tuple(tail),
                    problems=tuple(problems),
                    first_prompt=_first_prompt(c, tid, firsts.get(tid)) if count else "",
                )
            )
    out.sort(key=lambda s: (s.last_activity is not None, s.last_activity or 0.0, s.thread_id), reverse=True)
    return out


def _tail_of(
    c: sqlite3.Connection, thread_id: str, window: list[tuple[int, bytes]], count: int
) -> tuple[list[AnyMessage], list[CorruptRow]]:
    """The last assistant message and all after it (all messages if there is none)."""
    messages, ids, problems = _decode_rows(window, thread_id)
    start = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AssistantMessage)), None)
    if start is not None:
        cut = ids[start]
        return messages[start:], [p for p in problems if p.row_id > cut]
    if len(window) >= count:
        return messages, problems
    # The window held no reply: look further back, newest first, by the stored role.
    older = window[0][0] if window else None
    found = c.execute(
        "SELECT id FROM messages WHERE thread_id = ? AND id < ? AND json_valid(message_json)"
        " AND json_extract(message_json, '$.role') = 'assistant' ORDER BY id DESC LIMIT 1",
        (thread_id, older),
    ).fetchone()
    rows = c.execute(
        "SELECT id, CAST(message_json AS BLOB) FROM messages WHERE thread_id = ? AND id >= ? AND id < ? ORDER BY id",
        (thread_id, found[0] if found else 0, older),
    ).fetchall()
    more, _, more_problems = _decode_rows(rows, thread_id)
    return more + messages, more_problems + problems


def _first_prompt(c: sqlite3.Connection, thread_id: str, first: tuple[int, bytes] | None) -> str:
    """Text of the thread's first user message, whitespace collapsed, cut to FIRST_PROMPT_CHARS."""
    message: AnyMessage | None = None
    if first is not None:
        decoded, _, _ = _decode_rows([first], thread_id)
        message = decoded[0] if decoded else None
    if not isinstance(message, UserMessage):
        row = c.execute(
            "SELECT id, CAST(message_json AS BLOB) FROM messages WHERE thread_id = ? AND json_valid(message_json)"
            " AND json_extract(message_json, '$.role') = 'user' ORDER BY id LIMIT 1",
            (thread_id,),
        ).fetchone()
        decoded = _decode_rows([row], thread_id)[0] if row else []
        message = decoded[0] if decoded else None
    if not isinstance(message, UserMessage):
        return ""
    text = " ".join(message.text.split())
    return text if len(text) <= FIRST_PROMPT_CHARS else text[: FIRST_PROMPT_CHARS - 1] + "…"


def _migration(*, durable: bool) -> Callable[[sqlite3.Connection], _Layout]:
    """The upgrade as one function for the connection thread: migrations in one transaction, then WAL."""

    def migrate(c: sqlite3.Connection) -> _Layout:
        with _write_txn(c):
            version = _read_layout(c).version or 0  # re-read under the lock: someone may have upgraded
            for step in MIGRATIONS[version:]:
                step(c)
            if version < len(MIGRATIONS):
                c.execute(f"DELETE FROM {SCHEMA_TABLE}")
                c.execute(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (?)", (len(MIGRATIONS),))
        # journal_mode cannot change inside a transaction, and switching needs every other
        # connection gone; if one is busy, the next open retries and the file works meanwhile.
        try:
            _set_pragmas(c, wal=True, durable=durable)
        except sqlite3.OperationalError:
            pass
        return _read_layout(c)

    return migrate


def _read_layout(c: sqlite3.Connection) -> _Layout:
    """Tables, their columns and our schema version; reading sqlite_master also proves it is SQLite."""
    names = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    columns = {name: frozenset(_columns(c, name)) for name in names}
    version = None
    if SCHEMA_TABLE in columns:
        row = c.execute(f"SELECT MAX(version) FROM {SCHEMA_TABLE}").fetchone()
        version = row[0] if row and row[0] is not None else 0
    return _Layout(columns, version)


def _columns(c: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in c.execute(f"PRAGMA table_info({_quote_ident(table)})")]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _set_pragmas(c: sqlite3.Connection, *, wal: bool, durable: bool) -> None:
    if wal:
        c.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL survives a killed process (the crash this app supervises) at a fraction
    # of the cost of an fsync per commit; FULL also survives power loss.
    c.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")


# --- connection ------------------------------------------------------------------------------


async def _connect(path: Path, *, read_only: bool, busy_timeout: float) -> aiosqlite.Connection:
    """An aiosqlite connection in autocommit mode (we issue BEGIN/COMMIT ourselves).

    Read-only uses the ``mode=ro`` URI: SQLite then never writes the file, its journal, or
    creates a -wal beside a rollback-journal database.
    """
    target = f"file:{urllib.parse.quote(str(path))}?mode=ro" if read_only else str(path)
    try:
        db = await aiosqlite.connect(target, uri=read_only, isolation_level=None, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise _open_error(path, exc) from None
    return db


async def _call(db: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(connection)`` on aiosqlite's connection thread in one hop.

    aiosqlite's public calls cost one thread hop each (~30 µs here); a whole transaction
    in one queued function keeps an append to one hop. ``_execute`` and ``_conn`` are the
    queue and connection every public aiosqlite call goes through.
    """
    return await db._execute(lambda: fn(db._conn))


def _is_busy(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


def _check_path(path: Path, *, create: bool) -> bool:
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


def _writable_place(path: Path) -> bool:
    # WAL needs to create -wal and -shm beside the file, so the directory must be writable too.
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def _open_error(path: Path, exc: BaseException) -> BaseException:
    """One sentence for a failure while opening; our own errors pass through unchanged."""
    if isinstance(exc, CheckpointError) or not isinstance(exc, sqlite3.Error):
        return exc
    text = str(exc).lower()
    if "not a database" in text:
        return DatabaseOpenError(f"{path} is not a SQLite database.")
    if "malformed" in text:
        return DatabaseOpenError(f"{path} is a damaged SQLite database (its disk image is malformed).")
    if _is_busy(exc):
        return StoreBusyError(f"{path} is locked by another program; try again when it is done.")
    if "readonly" in text and _has_hot_journal(path):
        return _hot_journal_error(path)
    if "unable to open" in text or "readonly" in text:
        if not path.exists() or not os.access(path.parent, os.W_OK):
            return DatabaseOpenError(f"Cannot create {path}: the directory {path.parent} is not writable.")
        return DatabaseOpenError(f"{path} cannot be opened: {exc}.")
    return DatabaseOpenError(f"{path} cannot be opened: {exc}.")


def _has_hot_journal(path: Path) -> bool:
    return Path(f"{path}-journal").exists()


def _hot_journal_error(path: Path) -> DatabaseOpenError:
    # A writer died mid-transaction: reading needs SQLite to roll its journal back, which
    # changes the file, and browsing never changes a file; a read-write open does it.
    return DatabaseOpenError(
        f"{path} holds an unfinished write of a program that stopped mid-transaction; open it once"
        " with cubeloop or the sqlite3 shell to roll that write back, as browsing never changes the file."
    )
