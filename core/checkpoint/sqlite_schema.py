"""The SQLite schema: cubeloop's tables, ours beside them, and the ordered migrations.

``MIGRATIONS[i]`` brings a file to schema version ``i + 1``; the version is kept in
``cubepi_schema``. A file without that table is cubeloop's (version ``None``).

* v1: cubeloop's tables (created, or completed with the columns later cubeloop releases
  added), an index on ``messages(thread_id, id)``, ``cubepi_schema``.
* v2: the supervision tables: ``cubepi_tool_journal``, ``cubepi_jobs``, ``cubepi_leases``,
  ``cubepi_live_events``, ``cubepi_commands``. Their times are unix seconds (REAL), unlike
  cubeloop's ``julianday()`` columns.
* v3: owners, revisions and tool steps: ``cubepi_thread_records`` (one row per thread of
  ours: its owner, ``NULL`` for none, when it was created, its fingerprints record and the
  revisions of that record and of the thread's extra), ``cubepi_steps`` (a stepped tool's
  committed progress), and a ``revision`` column on jobs, leases and commands. No row is
  added for the threads already there, so every earlier thread (ours before v3, and
  cubeloop's) is unowned (:data:`core.owners.UNOWNED`).
* v4: a record for every thread: one without owner for each thread already there (so they
  stay unowned), an index on the records' ``(owner, thread_id)``, and triggers on
  cubeloop's tables that give a thread cubeloop writes its record (without owner). An
  owner's threads, and the unowned ones, are then read from that index alone.

Only :mod:`core.checkpoint.sqlite` and its ``sqlite_*`` helpers import this module.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

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

JOURNAL = "cubepi_tool_journal"
JOBS = "cubepi_jobs"
LEASES = "cubepi_leases"
LIVE_EVENTS = "cubepi_live_events"
COMMANDS = "cubepi_commands"
RECORDS = "cubepi_thread_records"
STEPS = "cubepi_steps"

_SUPERVISION_TABLES = (
    f"CREATE TABLE IF NOT EXISTS {JOURNAL} (thread_id TEXT NOT NULL, tool_call_id TEXT NOT NULL,"
    " tool_name TEXT NOT NULL DEFAULT '', run_id TEXT, started_at REAL, ended_at REAL, job_key TEXT,"
    " PRIMARY KEY (thread_id, tool_call_id))",
    f"CREATE TABLE IF NOT EXISTS {JOBS} (thread_id TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL,"
    " result_json TEXT, tool_call_id TEXT, started_at REAL, finished_at REAL, attempts INTEGER NOT NULL DEFAULT 1,"
    " PRIMARY KEY (thread_id, key))",
    f"CREATE TABLE IF NOT EXISTS {LEASES} (thread_id TEXT PRIMARY KEY, holder_id TEXT NOT NULL, pid INTEGER NOT NULL,"
    " host TEXT NOT NULL, run_id TEXT, acquired_at REAL NOT NULL, heartbeat_at REAL NOT NULL, expires_at REAL NOT NULL)",
    # AUTOINCREMENT: a seq is never reused after pruning, so a reader's after_seq stays valid.
    f"CREATE TABLE IF NOT EXISTS {LIVE_EVENTS} (seq INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL,"
    " run_id TEXT, data_json TEXT NOT NULL, at REAL NOT NULL)",
    f"CREATE INDEX IF NOT EXISTS ix_cubepi_live_events_thread ON {LIVE_EVENTS} (thread_id, seq)",
    f"CREATE TABLE IF NOT EXISTS {COMMANDS} (seq INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL,"
    " kind TEXT NOT NULL, text TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, created_at REAL NOT NULL,"
    " updated_at REAL NOT NULL, note TEXT NOT NULL DEFAULT '')",
    f"CREATE INDEX IF NOT EXISTS ix_cubepi_commands_thread_status ON {COMMANDS} (thread_id, status)",
)


def _v1_cubeloop_tables_and_thread_index(db: sqlite3.Connection) -> None:
    """cubeloop's tables (created or completed), the thread index, the schema-version table."""
    for ddl in _CUBELOOP_TABLES:
        db.execute(ddl)
    for table, column, kind in _CUBELOOP_LATE_COLUMNS:
        if column not in columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    # Loads and thread listings walk one thread in id order; cubeloop has no such index.
    db.execute("CREATE INDEX IF NOT EXISTS ix_messages_thread_id ON messages (thread_id, id)")
    db.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER NOT NULL)")


def _v2_supervision_tables(db: sqlite3.Connection) -> None:
    """Tool journal, idempotent jobs, leases, the bounded live-event log and the command outbox."""
    for ddl in _SUPERVISION_TABLES:
        db.execute(ddl)


_V3_TABLES = (
    # owner NULL: the thread records none (UNOWNED). created_at NULL: unknown (a record made
    # later for a thread written before v3 or by cubeloop). fingerprints_json and
    # overrides_json hold Fingerprints and FingerprintOverride objects as JSON.
    f"CREATE TABLE IF NOT EXISTS {RECORDS} (thread_id TEXT PRIMARY KEY, owner TEXT, created_at REAL,"
    " fingerprints_json TEXT, fingerprints_revision INTEGER NOT NULL DEFAULT 0,"
    " overrides_json TEXT NOT NULL DEFAULT '[]', extra_revision INTEGER NOT NULL DEFAULT 0)",
    f"CREATE TABLE IF NOT EXISTS {STEPS} (thread_id TEXT NOT NULL, key TEXT NOT NULL,"
    " input_fingerprint TEXT NOT NULL, workflow TEXT NOT NULL, next_step INTEGER NOT NULL DEFAULT 0,"
    " total_steps INTEGER, revision INTEGER NOT NULL DEFAULT 0, data_json TEXT NOT NULL DEFAULT 'null',"
    " tool_call_id TEXT, updated_at REAL NOT NULL, PRIMARY KEY (thread_id, key))",
)
_V3_REVISIONS = (JOBS, LEASES, COMMANDS)
"""Our tables whose rows gain a ``revision`` (existing rows read 1: written once as far as we know)."""


def _v3_owners_revisions_steps(db: sqlite3.Connection) -> None:
    """Thread records (owner, fingerprints, extra revision), step records, and revisions on
    jobs, leases and commands; every thread already in the file stays without a record (unowned)."""
    for ddl in _V3_TABLES:
        db.execute(ddl)
    for table in _V3_REVISIONS:
        if "revision" not in columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN revision INTEGER NOT NULL DEFAULT 1")


THREAD_TABLES = (
    "messages",
    "thread_extra",
    "runs",
    "thread_pending_request",
    JOURNAL,
    JOBS,
    STEPS,
    LIVE_EVENTS,
    COMMANDS,
    LEASES,
)
"""The tables whose rows make a thread exist (with its record, the thread's whole presence):
cubeloop's and ours, since a thread of before v3 may have rows only in ours (a finished
job, a pending command). ``thread_hitl_answers`` only ever follows a pending request."""

RECORDED_BY_TRIGGER = ("messages", "thread_extra", "runs", "thread_pending_request")
"""cubeloop's tables whose new rows give their thread a record (no owner) when it has none,
from v4: cubeloop writes them without one, and our own writes make the record first."""

EVERY_THREAD_RECORDED = 4
"""The schema version from which every thread has a row in ``cubepi_thread_records``."""


def _v4_a_record_for_every_thread(db: sqlite3.Connection) -> None:
    """Every thread gets a record: those already in the file one without owner (they stay
    unowned), cubeloop's new ones one by trigger, so that an owner's threads, and the
    unowned ones, are found from the records' owner index alone, never by walking every
    thread of every owner. No existing row is changed."""
    db.execute(f"CREATE INDEX IF NOT EXISTS ix_{RECORDS}_owner ON {RECORDS} (owner, thread_id)")
    present = " UNION ".join(f"SELECT thread_id FROM {t}" for t in THREAD_TABLES if columns(db, t))
    db.execute(
        f"INSERT INTO {RECORDS} (thread_id) SELECT thread_id FROM ({present}) AS found WHERE thread_id IS NOT NULL"
        f" AND NOT EXISTS (SELECT 1 FROM {RECORDS} AS r WHERE r.thread_id = found.thread_id)"
    )
    for table in RECORDED_BY_TRIGGER:
        # A plain INSERT under a WHEN: the conflict policy of the statement that fired the
        # trigger (cubeloop's INSERT OR REPLACE) would otherwise apply to it and could
        # replace an existing record.
        db.execute(
            f"CREATE TRIGGER IF NOT EXISTS cubepi_record_{table} AFTER INSERT ON {table}"
            f" WHEN NOT EXISTS (SELECT 1 FROM {RECORDS} WHERE thread_id = NEW.thread_id)"
            f" BEGIN INSERT INTO {RECORDS} (thread_id) VALUES (NEW.thread_id); END"
        )


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_cubeloop_tables_and_thread_index,
    _v2_supervision_tables,
    _v3_owners_revisions_steps,
    _v4_a_record_for_every_thread,
]
"""Ordered migrations: applying ``MIGRATIONS[i]`` brings a file to schema version ``i + 1``.

Each takes a ``sqlite3.Connection`` inside an open transaction and must be safe to run on
a cubeloop file (create if missing, never rewrite a row). Append only; never reorder."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What the open file holds: tables and their columns (browse mode tolerates missing ones)."""

    columns: dict[str, frozenset[str]]
    version: int | None

    def has(self, table: str, column: str | None = None) -> bool:
        """Whether ``table`` (and, if given, its ``column``) exists in the file."""
        cols = self.columns.get(table)
        return cols is not None and (column is None or column in cols)


class read_txn:
    """A read transaction for one call: one snapshot, closed before the call returns."""

    def __init__(self, c: sqlite3.Connection) -> None:
        self.c = c

    def __enter__(self) -> None:
        self.c.execute("BEGIN")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is not None:
            self.c.rollback()
            return
        try:
            self.c.execute("COMMIT")
        except BaseException:
            # A COMMIT that fails (busy on a rollback-journal file, disk full) leaves the
            # transaction open, and every later BEGIN on this connection would fail; the
            # caller's busy retry runs the whole call again from a clean connection.
            self.c.rollback()
            raise


class write_txn(read_txn):
    """``BEGIN IMMEDIATE``: take the write lock first, so a read never has to be upgraded.

    Everything read inside is therefore current until COMMIT: another process cannot
    write in between, which is what makes read-decide-write calls atomic across processes.
    """

    def __enter__(self) -> None:
        self.c.execute("BEGIN IMMEDIATE")


def migration(*, durable: bool) -> Callable[[sqlite3.Connection], Layout]:
    """The upgrade as one function for the connection thread: migrations in one transaction, then WAL."""

    def migrate(c: sqlite3.Connection) -> Layout:
        steps = MIGRATIONS  # read at call time, so tests can append a step
        with write_txn(c):
            version = read_layout(c).version or 0  # re-read under the lock: someone may have upgraded
            for step in steps[version:]:
                step(c)
            if version < len(steps):
                c.execute(f"DELETE FROM {SCHEMA_TABLE}")
                c.execute(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (?)", (len(steps),))
        # journal_mode cannot change inside a transaction, and switching needs every other
        # connection gone; if one is busy, the next open retries and the file works meanwhile.
        try:
            set_pragmas(c, wal=True, durable=durable)
        except sqlite3.OperationalError:
            pass
        return read_layout(c)

    return migrate


def read_layout(c: sqlite3.Connection) -> Layout:
    """Tables, their columns and our schema version; reading sqlite_master also proves it is SQLite."""
    names = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    found = {name: frozenset(columns(c, name)) for name in names}
    version = None
    if SCHEMA_TABLE in found:
        row = c.execute(f"SELECT MAX(version) FROM {SCHEMA_TABLE}").fetchone()
        version = row[0] if row and row[0] is not None else 0
    return Layout(found, version)


def columns(c: sqlite3.Connection, table: str) -> list[str]:
    """Column names of ``table`` (empty if it does not exist)."""
    return [r[1] for r in c.execute(f"PRAGMA table_info({_quote_ident(table)})")]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def set_pragmas(c: sqlite3.Connection, *, wal: bool, durable: bool) -> None:
    """WAL (when asked) and the sync level; outside any transaction."""
    if wal:
        c.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL survives a killed process (the crash this app supervises) at a fraction
    # of the cost of an fsync per commit; FULL also survives power loss.
    c.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
