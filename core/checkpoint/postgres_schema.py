"""The PostgreSQL schema: cubeloop's v5 tables, ours beside them, and the ordered migrations.

cubeloop's tables (``cubepi_*``) are created exactly as its SQLAlchemy metadata
(``cubeloop.checkpointer.postgres.models.cubeloop_metadata``, 0.15.3) compiles for the
postgresql dialect, plus the 64 hash partitions of ``cubepi_messages`` and ``cubepi_runs``
(``alembic_helpers.create_message_partitions_op`` / ``create_runs_partitions_op``) and the
version row 5 (``write_schema_version_op``). They are never altered here: no column, no
index. Our tables are prefixed ``cubepi_tui_``:

* ``cubepi_tui_schema`` (our schema version), ``cubepi_tui_writes`` (the write ids that
  make a retried write idempotent, see :mod:`core.checkpoint.reconnect`);
* the supervision tables: tool journal, jobs, leases, live events, commands, and
  ``cubepi_tui_pending`` (the exact text of a pending request we wrote: JSONB reorders keys);
* ``cubepi_tui_thread_stats``: per thread the message count, newest row, last assistant and
  first user row, kept by a statement trigger on ``cubepi_messages`` so the thread listing
  reads one row per thread instead of scanning every message (whoever appends, cubeloop too);
* ``cubepi_tui_changes``: 64 counters; a deferred trigger on every data table (cubeloop's
  and ours) adds one to a counter (chosen by backend pid) once per transaction at commit and
  sends ``NOTIFY cubepi_tui_changes``. The sum of the counters is the change token: every
  commit that changed a row raises it, whichever process made it, and reading it costs 64
  rows. A counter row is locked only in the commit phase, after every other lock of the
  transaction was taken, so it cannot close a deadlock cycle.

``MIGRATIONS[i]`` brings our tables to version ``i + 1``. Only :mod:`core.checkpoint.postgres`
and its ``postgres_*`` helpers import this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

CUBELOOP_VERSION = 5
"""The cubeloop schema version this module reads and writes (``EXPECTED_SCHEMA_VERSION``)."""

PARTITIONS = 64
"""cubeloop's ``PARTITION_COUNT``: hash partitions of ``cubepi_messages`` and ``cubepi_runs``."""

CHANNEL = "cubepi_tui_changes"
"""The NOTIFY channel our triggers signal on at each commit that changed data."""

LOCK_CLASS = 0x43545549  # "CTUI": the first key of our two-key advisory locks
"""Our advisory locks use the two-int form, a key space apart from cubeloop's one-bigint
``pg_advisory_xact_lock(hashtext(thread_id))``, so they never wait on each other by accident."""

_CUBELOOP_TABLES = (
    "CREATE TABLE cubepi_schema_version (version SERIAL NOT NULL, PRIMARY KEY (version))",
    "CREATE TABLE cubepi_threads (thread_id TEXT NOT NULL, parent_thread_id TEXT, forked_at_seq BIGINT,"
    " extra JSONB DEFAULT '{}'::jsonb NOT NULL, pending_request JSONB DEFAULT NULL, run_id TEXT DEFAULT NULL,"
    " created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,"
    " updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, PRIMARY KEY (thread_id),"
    " FOREIGN KEY(parent_thread_id) REFERENCES cubepi_threads (thread_id))",
    "CREATE TABLE cubepi_hitl_answers (thread_id TEXT NOT NULL, run_id TEXT NOT NULL, question_id TEXT NOT NULL,"
    " answer JSONB NOT NULL, answered_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,"
    " PRIMARY KEY (thread_id, run_id, question_id),"
    " FOREIGN KEY(thread_id) REFERENCES cubepi_threads (thread_id) ON DELETE CASCADE)",
    "CREATE TABLE cubepi_messages (thread_id TEXT NOT NULL, seq BIGINT NOT NULL, role TEXT NOT NULL,"
    " metadata JSONB DEFAULT '{}'::jsonb NOT NULL, payload BYTEA NOT NULL, run_id TEXT,"
    " created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, PRIMARY KEY (thread_id, seq),"
    " FOREIGN KEY(thread_id) REFERENCES cubepi_threads (thread_id) ON DELETE CASCADE) PARTITION BY HASH (thread_id)",
    "CREATE INDEX ix_cubepi_messages_thread_run ON cubepi_messages (thread_id, run_id)",
    "CREATE INDEX ix_cubepi_messages_metadata_gin ON cubepi_messages USING gin (metadata jsonb_path_ops)",
    "CREATE TABLE cubepi_runs (thread_id TEXT NOT NULL, run_id TEXT NOT NULL,"
    " claimed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL, completed_at TIMESTAMP WITH TIME ZONE,"
    " completion_seq BIGINT, PRIMARY KEY (thread_id, run_id),"
    " FOREIGN KEY(thread_id) REFERENCES cubepi_threads (thread_id) ON DELETE CASCADE) PARTITION BY HASH (thread_id)",
    "CREATE INDEX ix_cubepi_runs_thread_seq ON cubepi_runs (thread_id, completion_seq)",
)


def cubeloop_ddl() -> list[str]:
    """Every statement that creates cubeloop's v5 schema on an empty database, in order."""
    partitions = [
        f"CREATE TABLE {table}_p{i:02d} PARTITION OF {table} FOR VALUES WITH (modulus {PARTITIONS}, remainder {i})"
        for table in ("cubepi_messages", "cubepi_runs")
        for i in range(PARTITIONS)
    ]
    version = [
        f"DELETE FROM cubepi_schema_version WHERE version <> {CUBELOOP_VERSION}",
        f"INSERT INTO cubepi_schema_version (version) VALUES ({CUBELOOP_VERSION}) ON CONFLICT DO NOTHING",
    ]
    return [*_CUBELOOP_TABLES, *partitions, *version]


CUBELOOP_DATA_TABLES = ("cubepi_threads", "cubepi_messages", "cubepi_runs", "cubepi_hitl_answers")

SCHEMA = "cubepi_tui_schema"
WRITES = "cubepi_tui_writes"
JOURNAL = "cubepi_tui_tool_journal"
JOBS = "cubepi_tui_jobs"
LEASES = "cubepi_tui_leases"
LIVE_EVENTS = "cubepi_tui_live_events"
COMMANDS = "cubepi_tui_commands"
PENDING = "cubepi_tui_pending"
STATS = "cubepi_tui_thread_stats"
CHANGES = "cubepi_tui_changes"

OUR_DATA_TABLES = (JOURNAL, JOBS, LEASES, LIVE_EVENTS, COMMANDS, PENDING)

_V1_TABLES = (
    f"CREATE TABLE {SCHEMA} (version INTEGER NOT NULL)",
    # Times are unix seconds (float8), stamped by the client as the memory and SQLite stores do.
    f"CREATE TABLE {WRITES} (write_id TEXT PRIMARY KEY, thread_id TEXT, at DOUBLE PRECISION NOT NULL, result TEXT)",
    f"CREATE INDEX ix_{WRITES}_at ON {WRITES} (at)",
    f"CREATE TABLE {JOURNAL} (thread_id TEXT NOT NULL, tool_call_id TEXT NOT NULL, ord BIGSERIAL,"
    " tool_name TEXT NOT NULL DEFAULT '', run_id TEXT, started_at DOUBLE PRECISION, ended_at DOUBLE PRECISION,"
    " job_key TEXT, PRIMARY KEY (thread_id, tool_call_id))",
    f"CREATE TABLE {JOBS} (thread_id TEXT NOT NULL, key TEXT NOT NULL, status TEXT NOT NULL, result TEXT,"
    " tool_call_id TEXT, started_at DOUBLE PRECISION, finished_at DOUBLE PRECISION,"
    " attempts INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (thread_id, key))",
    f"CREATE TABLE {LEASES} (thread_id TEXT PRIMARY KEY, holder_id TEXT NOT NULL, pid INTEGER NOT NULL,"
    " host TEXT NOT NULL, run_id TEXT, acquired_at DOUBLE PRECISION NOT NULL,"
    " heartbeat_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
    # A sequence never hands a number out twice, so a reader's after_seq stays valid after pruning.
    f"CREATE TABLE {LIVE_EVENTS} (seq BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, run_id TEXT,"
    " data TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    f"CREATE INDEX ix_{LIVE_EVENTS}_thread ON {LIVE_EVENTS} (thread_id, seq)",
    f"CREATE TABLE {COMMANDS} (seq BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, kind TEXT NOT NULL,"
    " text TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
    " updated_at DOUBLE PRECISION NOT NULL, note TEXT NOT NULL DEFAULT '')",
    f"CREATE INDEX ix_{COMMANDS}_thread ON {COMMANDS} (thread_id, seq)",
    f"CREATE TABLE {PENDING} (thread_id TEXT PRIMARY KEY, request_text TEXT NOT NULL,"
    " created_at DOUBLE PRECISION NOT NULL)",
    f"CREATE TABLE {STATS} (thread_id TEXT PRIMARY KEY, n BIGINT NOT NULL, last_seq BIGINT,"
    " last_at TIMESTAMP WITH TIME ZONE, last_assistant_seq BIGINT, first_user_seq BIGINT)",
    f"CREATE TABLE {CHANGES} (bucket INTEGER PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)",
    f"INSERT INTO {CHANGES} (bucket) SELECT g FROM generate_series(0, {PARTITIONS - 1}) AS g",
)

STATS_COLUMNS = "thread_id, n, last_seq, last_at, last_assistant_seq, first_user_seq"
STATS_OF_MESSAGES = (
    "SELECT thread_id, count(*) AS n, max(seq) AS last_seq, max(created_at) AS last_at,"
    " max(seq) FILTER (WHERE role = 'assistant') AS last_assistant_seq,"
    " min(seq) FILTER (WHERE role = 'user') AS first_user_seq FROM {rows} GROUP BY thread_id"
)
"""Per-thread stats computed from message rows (``{rows}``: the table, or a trigger's new rows)."""

_V1_FUNCTIONS = (
    f"""CREATE FUNCTION cubepi_tui_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- once per transaction: the setting is local to it
  IF current_setting('cubepi_tui.bumped', true) IS DISTINCT FROM '1' THEN
    PERFORM set_config('cubepi_tui.bumped', '1', true);
    UPDATE {CHANGES} SET n = n + 1 WHERE bucket = pg_backend_pid() % {PARTITIONS};
    PERFORM pg_notify('{CHANNEL}', '');
  END IF;
  RETURN NULL;
END $$""",
    f"""CREATE FUNCTION cubepi_tui_count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {STATS} AS s ({STATS_COLUMNS}) {STATS_OF_MESSAGES.format(rows="new_rows")}
  ON CONFLICT (thread_id) DO UPDATE SET n = s.n + EXCLUDED.n,
    last_seq = greatest(s.last_seq, EXCLUDED.last_seq), last_at = greatest(s.last_at, EXCLUDED.last_at),
    last_assistant_seq = greatest(s.last_assistant_seq, EXCLUDED.last_assistant_seq),
    first_user_seq = least(s.first_user_seq, EXCLUDED.first_user_seq);
  RETURN NULL;
END $$""",
)


def _v1_triggers() -> list[str]:
    bumps = [
        f"CREATE CONSTRAINT TRIGGER cubepi_tui_bump AFTER INSERT OR UPDATE OR DELETE ON {table}"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cubepi_tui_bump()"
        for table in (*CUBELOOP_DATA_TABLES, *OUR_DATA_TABLES)
    ]
    return [
        *bumps,
        "CREATE TRIGGER cubepi_tui_count_messages AFTER INSERT ON cubepi_messages"
        " REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION cubepi_tui_count_messages()",
    ]


Connection = Any  # an asyncpg connection; typed loosely so this module needs no driver import


async def _v1_our_tables(conn: Connection) -> None:
    """Our tables, the change counters and their triggers, and the thread stats backfilled."""
    for ddl in (*_V1_TABLES, *_V1_FUNCTIONS, *_v1_triggers()):
        await conn.execute(ddl)
    # The triggers hold their tables' locks until commit, so no append slips in between.
    await conn.execute(f"INSERT INTO {STATS} ({STATS_COLUMNS}) {STATS_OF_MESSAGES.format(rows='cubepi_messages')}")


MIGRATIONS: list[Callable[[Connection], Awaitable[None]]] = [_v1_our_tables]
"""Ordered migrations: applying ``MIGRATIONS[i]`` brings our tables to version ``i + 1``.

Each takes an asyncpg connection inside an open transaction; it adds, never rewrites a
row of cubeloop's. Append only; never reorder. Read at call time, so tests can add a step."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What the database holds: cubeloop's tables and version, and our version (``None``: none of ours)."""

    has_cubeloop: bool
    cubeloop_version: int | None
    version: int | None

    @property
    def empty(self) -> bool:
        """Neither cubeloop's tables nor ours."""
        return not self.has_cubeloop and self.version is None


async def read_layout(conn: Connection) -> Layout:
    """Read which tables exist and both versions; reads only."""
    row = await conn.fetchrow(
        "SELECT to_regclass('cubepi_threads') IS NOT NULL AS threads,"
        " to_regclass('cubepi_schema_version') IS NOT NULL AS versions,"
        f" to_regclass('{SCHEMA}') IS NOT NULL AS ours"
    )
    cubeloop_version = None
    if row["versions"]:
        cubeloop_version = await conn.fetchval("SELECT max(version) FROM cubepi_schema_version")
    version = None
    if row["ours"]:
        version = await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {SCHEMA}")
    return Layout(bool(row["threads"] or row["versions"]), cubeloop_version, version)


async def migrate(conn: Connection, *, create_cubeloop: bool) -> Layout:
    """Inside the caller's transaction: serialise with other upgraders, create cubeloop's
    tables when asked and missing, apply the missing migrations, record our version."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", LOCK_CLASS)
    layout = await read_layout(conn)  # again, under the lock: someone may have done it meanwhile
    if create_cubeloop and not layout.has_cubeloop:
        for ddl in cubeloop_ddl():
            await conn.execute(ddl)
    steps = MIGRATIONS
    version = layout.version or 0
    for step in steps[version:]:
        await step(conn)
    if version < len(steps):
        await conn.execute(f"DELETE FROM {SCHEMA}")
        await conn.execute(f"INSERT INTO {SCHEMA} (version) VALUES ($1)", len(steps))
    return await read_layout(conn)
