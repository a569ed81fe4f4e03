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

* the write functions (v2): each hot write - append, ``save_extra``, a tool event, live
  events, a heartbeat - is one PL/pgSQL function doing its write-id check, fence, locks and
  rows, called as one statement in its own implicit transaction: one round trip. Each one
  does what cubeloop's statements do, in the same order, under the same locks. A refusal
  is raised with one of our SQLSTATEs (``LEASE_REFUSED`` ...) and a JSON DETAIL, from
  which :func:`core.checkpoint.postgres_conn.refusal` makes the sentence.
* owners and revisions (v3): ``cubepi_tui_thread_records`` holds each thread's owner
  (``NULL``: unowned), creation time, fingerprints and overrides (JSON) with their revision,
  and the extra's revision; ``cubepi_tui_steps`` the tool steps; leases, jobs and commands
  get a ``revision`` column. A thread without a record (cubeloop's, or ours from before v3)
  is unowned. Every query is scoped by owner in its own text (:class:`Scope`); every write
  passes the admission ``cubepi_tui_own`` first, inside its own transaction, and the write
  functions take the owner (v2's are replaced).
* every thread recorded (v4): each thread already stored gets a record without owner (it
  stays unowned) and a trigger gives each thread row cubeloop creates one, so an owner's
  threads - and the unowned ones - are read from the records' owner index alone
  (:meth:`Scope.threads`), never by walking every owner's threads; and the admission counts
  a thread with rows only in our tables (:data:`THREAD_TABLES`) as existing.

``MIGRATIONS[i]`` brings our tables to version ``i + 1``. Only :mod:`core.checkpoint.postgres`
and its ``postgres_*`` helpers import this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.checkpoint.base import EXTRA_RECORD

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


# --- v2: every hot write as one function of ours, so it costs one round trip -------------------

LEASE_REFUSED = "CT001"
"""SQLSTATE our functions raise when the fence refuses a write; DETAIL is JSON
``{"thread_id", "holder_id", "now", "lease"}`` (``lease``: the row as an object, or null)."""

RUN_COMPLETED = "CT002"
"""SQLSTATE of an append naming a completed run; DETAIL is JSON ``{"thread_id", "run_id"}``."""

EXTRA_NOT_OBJECT = "CT003"
"""SQLSTATE of a ``save_extra`` onto an extra that is not an object; DETAIL is JSON ``{"thread_id"}``."""

_CLAIM = "IF NOT cubepi_tui_claim_write(p_write_id, p_thread, p_now) THEN RETURN; END IF;"
# The journal's upsert: a start clears an old end, and a phase overwrites only what it names.
_JOURNAL_UPSERT = f"""INSERT INTO {JOURNAL} AS j (thread_id, tool_call_id, tool_name, run_id, started_at, ended_at, job_key)
  VALUES (p_thread, p_tool_call_id, p_tool_name, p_run_id,
          CASE WHEN p_phase = 'start' THEN p_at END, CASE WHEN p_phase = 'end' THEN p_at END, p_job_key)
  ON CONFLICT (thread_id, tool_call_id) DO UPDATE SET
    tool_name = CASE WHEN EXCLUDED.tool_name <> '' THEN EXCLUDED.tool_name ELSE j.tool_name END,
    run_id = COALESCE(EXCLUDED.run_id, j.run_id), job_key = COALESCE(EXCLUDED.job_key, j.job_key),
    started_at = CASE WHEN p_phase = 'start' THEN EXCLUDED.started_at ELSE j.started_at END,
    ended_at = CASE WHEN p_phase = 'start' THEN NULL ELSE EXCLUDED.ended_at END;"""

_V2_FUNCTIONS = (
    # Whether this write id is new (recorded now, in the caller's transaction) or an earlier
    # attempt of the same write already committed. Waits for an attempt still in flight.
    f"""CREATE FUNCTION cubepi_tui_claim_write(p_write_id text, p_thread text, p_now float8) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {WRITES} (write_id, thread_id, at) VALUES (p_write_id, p_thread, p_now) ON CONFLICT DO NOTHING;
  RETURN FOUND;
END $$""",
    # The fence: core.checkpoint.base.check_lease_holder's rule for a store that never waits
    # on a file lock (no lock-wait credit): held by p_holder and expires_at after now, where
    # now is the client's clock when it sent the statement (p_now) moved on by the time the
    # statement has run so far (waits for locks included). The lease row stays locked FOR
    # UPDATE until commit, so no takeover lands between this check and the write.
    f"""CREATE FUNCTION cubepi_tui_fence(p_thread text, p_holder text, p_now float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  l {LEASES}%ROWTYPE;
  v_found boolean;
  v_now float8;
BEGIN
  IF p_holder IS NULL THEN RETURN; END IF;
  SELECT * INTO l FROM {LEASES} WHERE thread_id = p_thread FOR UPDATE;
  v_found := FOUND;
  v_now := p_now + extract(epoch FROM clock_timestamp() - statement_timestamp())::float8;
  IF v_found AND l.holder_id = p_holder AND l.expires_at > v_now THEN RETURN; END IF;
  RAISE EXCEPTION USING ERRCODE = '{LEASE_REFUSED}', MESSAGE = 'the lease fence refused the write',
    DETAIL = json_build_object('thread_id', p_thread, 'holder_id', p_holder, 'now', v_now,
                               'lease', CASE WHEN v_found THEN row_to_json(l) END)::text;
END $$""",
    # cubeloop's append statement for statement (its per-thread lock, lazy thread row,
    # completed-run check, MAX(seq) + 1...), with the write id and the fence, in one call.
    # Plans stay the plan cache's choice (custom: re-planned at each call, ~0.1 ms for a
    # query on the 64-partition tables): forcing generic ones saves that but costs ~20 ms
    # on a connection's first call (a generic plan covers all 64 partitions).
    f"""CREATE FUNCTION cubepi_tui_append(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_roles text[], p_metadata text[], p_payloads bytea[], p_run_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  v_done text;
  v_last bigint;
BEGIN
  {_CLAIM}
  PERFORM pg_advisory_xact_lock(hashtext(p_thread));
  PERFORM cubepi_tui_fence(p_thread, p_holder, p_now);
  INSERT INTO cubepi_threads (thread_id) VALUES (p_thread) ON CONFLICT DO NOTHING;
  IF array_remove(p_run_ids, NULL) <> '{{}}' THEN  -- as cubeloop, only when a row names a run
    SELECT run_id INTO v_done FROM cubepi_runs WHERE thread_id = p_thread AND run_id = ANY(p_run_ids)
      AND completed_at IS NOT NULL ORDER BY run_id LIMIT 1;
  END IF;
  IF v_done IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '{RUN_COMPLETED}', MESSAGE = 'append to a completed run',
      DETAIL = json_build_object('thread_id', p_thread, 'run_id', v_done)::text;
  END IF;
  SELECT COALESCE(MAX(seq), 0) INTO v_last FROM cubepi_messages WHERE thread_id = p_thread;
  -- One statement for the batch: one firing of the stats trigger.
  INSERT INTO cubepi_messages (thread_id, seq, role, metadata, payload, run_id)
    SELECT p_thread, v_last + u.ord, u.role, u.metadata::jsonb, u.payload, u.run_id
    FROM unnest(p_roles, p_metadata, p_payloads, p_run_ids) WITH ORDINALITY AS u(role, metadata, payload, run_id, ord)
    ORDER BY u.ord;
END $$""",
    # cubeloop's upsert with the server-side || merge, refused when the extra is not an object.
    f"""CREATE FUNCTION cubepi_tui_save_extra(p_write_id text, p_thread text, p_now float8, p_patch text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  {_CLAIM}
  INSERT INTO cubepi_threads (thread_id, extra, updated_at) VALUES (p_thread, p_patch::jsonb, now())
    ON CONFLICT (thread_id) DO UPDATE SET extra = cubepi_threads.extra || EXCLUDED.extra, updated_at = now()
    WHERE jsonb_typeof(cubepi_threads.extra) = 'object';
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '{EXTRA_NOT_OBJECT}', MESSAGE = 'the extra is not an object',
      DETAIL = json_build_object('thread_id', p_thread)::text;
  END IF;
END $$""",
    f"""CREATE FUNCTION cubepi_tui_tool_event(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_tool_call_id text, p_phase text, p_tool_name text, p_run_id text, p_job_key text, p_at float8)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  {_CLAIM}
  PERFORM cubepi_tui_fence(p_thread, p_holder, p_now);
  {_JOURNAL_UPSERT}
END $$""",
    # Insert the batch, then delete all but the thread's newest p_keep (one probe on
    # (thread_id, seq) and a range delete below it).
    f"""CREATE FUNCTION cubepi_tui_live_events(p_write_id text, p_thread text, p_now float8, p_run_id text,
  p_texts text[], p_keep integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  {_CLAIM}
  INSERT INTO {LIVE_EVENTS} (thread_id, run_id, data, at)
    SELECT p_thread, p_run_id, u.data, p_now FROM unnest(p_texts) WITH ORDINALITY AS u(data, ord) ORDER BY u.ord;
  IF p_keep <= 0 THEN
    DELETE FROM {LIVE_EVENTS} WHERE thread_id = p_thread;
    RETURN;
  END IF;
  DELETE FROM {LIVE_EVENTS} WHERE thread_id = p_thread AND seq <= (SELECT seq FROM {LIVE_EVENTS}
    WHERE thread_id = p_thread ORDER BY seq DESC OFFSET p_keep LIMIT 1);
END $$""",
    # The heartbeat, guarded by the holder. Its outcome is kept with the write id as the
    # client packed it (p_renewed / p_not_renewed), so a retry answers what the first attempt did.
    f"""CREATE FUNCTION cubepi_tui_renew_lease(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_heartbeat_at float8, p_expires_at float8, p_renewed text, p_not_renewed text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_result text;
BEGIN
  IF NOT cubepi_tui_claim_write(p_write_id, p_thread, p_now) THEN
    RETURN (SELECT result FROM {WRITES} WHERE write_id = p_write_id);
  END IF;
  UPDATE {LEASES} SET heartbeat_at = p_heartbeat_at, expires_at = p_expires_at
    WHERE thread_id = p_thread AND holder_id = p_holder;
  v_result := CASE WHEN FOUND THEN p_renewed ELSE p_not_renewed END;
  UPDATE {WRITES} SET result = v_result WHERE write_id = p_write_id;
  RETURN v_result;
END $$""",
)


async def _v2_write_functions(conn: Connection) -> None:
    """The write functions: each hot write (append, save_extra, tool event, live events,
    heartbeat) becomes one statement, one round trip instead of five to nine."""
    for ddl in _V2_FUNCTIONS:
        await conn.execute(ddl)


# --- v3: owners, revisions, fingerprints and tool steps ------------------------------------------

RECORDS = "cubepi_tui_thread_records"
STEPS = "cubepi_tui_steps"

V3_DATA_TABLES = (RECORDS, STEPS)
"""Our tables added by v3 that carry the change trigger too."""

THREAD_TABLES = ("cubepi_threads", *OUR_DATA_TABLES, STEPS)
"""The tables whose rows make a thread exist besides its record: cubeloop's thread row and
every per-thread table of ours, since a thread of before v3 may have rows only in ours (a
finished job, a pending command) and exists as much as one with messages."""


def thread_exists(thread: str, tables: tuple[str, ...] = THREAD_TABLES) -> str:
    """SQL true when any of ``tables`` holds a row of the thread ``thread`` names (a
    placeholder, a column or a PL/pgSQL variable); one index probe per table."""
    return "(" + " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE thread_id = {thread})" for t in tables) + ")"


THREAD_UNAVAILABLE = "CT004"
"""SQLSTATE of a write to a thread this store's owner cannot see (another owner's, or an
unowned one written by a named owner); DETAIL is JSON ``{"thread_id", "owner"}``."""

REVISION_CONFLICT = "CT005"
"""SQLSTATE of a compare-and-set write that found another revision; DETAIL is JSON
``{"thread_id", "record", "expected", "actual"}`` (``record``: ``base.EXTRA_RECORD``)."""

_V3_TABLES = (
    # One row per thread we wrote since v3 (and per unowned thread the unowned scope wrote a
    # revision to): owner NULL = unowned; created_at unix seconds, NULL when the thread
    # existed before its record (cubeloop's, or ours before v3); revision counts writes of
    # fingerprints/overrides (JSON text), extra_revision writes of the extra by save_extra.
    f"CREATE TABLE {RECORDS} (thread_id TEXT PRIMARY KEY, owner TEXT, created_at DOUBLE PRECISION,"
    " revision INTEGER NOT NULL DEFAULT 0, fingerprints TEXT, overrides TEXT NOT NULL DEFAULT '[]',"
    " extra_revision INTEGER NOT NULL DEFAULT 0)",
    f"CREATE INDEX ix_{RECORDS}_owner ON {RECORDS} (owner)",
    # Rows written before v3 count as written once.
    f"ALTER TABLE {LEASES} ADD COLUMN revision INTEGER NOT NULL DEFAULT 1",
    f"ALTER TABLE {JOBS} ADD COLUMN revision INTEGER NOT NULL DEFAULT 1",
    f"ALTER TABLE {COMMANDS} ADD COLUMN revision INTEGER NOT NULL DEFAULT 1",
    f"CREATE TABLE {STEPS} (thread_id TEXT NOT NULL, key TEXT NOT NULL, input_fingerprint TEXT NOT NULL,"
    " workflow TEXT NOT NULL, next_step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER,"
    " revision INTEGER NOT NULL DEFAULT 0, data TEXT, tool_call_id TEXT, updated_at DOUBLE PRECISION NOT NULL,"
    " PRIMARY KEY (thread_id, key))",
    *(
        f"CREATE CONSTRAINT TRIGGER cubepi_tui_bump AFTER INSERT OR UPDATE OR DELETE ON {table}"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cubepi_tui_bump()"
        for table in V3_DATA_TABLES
    ),
)

_V2_SIGNATURES = (
    "cubepi_tui_append(text, text, float8, text, text[], text[], bytea[], text[])",
    "cubepi_tui_save_extra(text, text, float8, text)",
    "cubepi_tui_tool_event(text, text, float8, text, text, text, text, text, text, float8)",
    "cubepi_tui_live_events(text, text, float8, text, text[], integer)",
    "cubepi_tui_renew_lease(text, text, float8, text, float8, float8, text, text)",
)
"""v2's write functions, replaced in v3 by ones that take the owner (and, for the extra, a revision)."""

_OWN = "PERFORM cubepi_tui_own(p_thread, p_owner, p_now, true);"


def _own_function(exists: str, verb: str = "CREATE") -> str:
    """The SQL that defines ``cubepi_tui_own``, whose existence check for a thread without a
    record is ``exists`` (SQL about ``p_thread``)."""
    # The owner admission every write makes first, inside its own transaction (a refusal
    # rolls back whatever the write did before). A thread's owner is its record's (NULL:
    # unowned); a thread without a record that exists (``exists`` is true) is unowned; a
    # thread with neither does not exist. p_adopt: a write that creates thread data gives a
    # thread that does not exist a record owned by p_owner (the unowned scope: no owner),
    # and gives an unowned thread without a record one in the unowned scope (so its
    # revisions have a row). Then: p_owner's thread (or a missing one) passes; any other
    # raises THREAD_UNAVAILABLE.
    return f"""{verb} FUNCTION cubepi_tui_own(p_thread text, p_owner text, p_now float8, p_adopt boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  v_owner text;
  v_exists boolean;
BEGIN
  SELECT coalesce(owner, '') INTO v_owner FROM {RECORDS} WHERE thread_id = p_thread;
  IF NOT FOUND THEN
    -- Again, in one snapshot with the thread row: a writer that committed its record and
    -- its thread row since the probe above is seen with its record, not as unowned.
    SELECT (SELECT coalesce(owner, '') FROM {RECORDS} WHERE thread_id = p_thread),
           {exists}
      INTO v_owner, v_exists;
    IF v_owner IS NULL THEN  -- still no record
      IF v_exists THEN
        v_owner := '';
      END IF;
      IF p_adopt AND coalesce(v_owner, p_owner) = p_owner THEN
        INSERT INTO {RECORDS} (thread_id, owner, created_at)
          VALUES (p_thread, nullif(p_owner, ''), CASE WHEN v_exists THEN NULL ELSE p_now END)
          ON CONFLICT (thread_id) DO NOTHING;
        IF FOUND THEN
          RETURN;
        END IF;
        -- another writer created it first (this waited for its commit): its owner decides
        SELECT coalesce(owner, '') INTO v_owner FROM {RECORDS} WHERE thread_id = p_thread;
      ELSIF v_owner IS NULL THEN
        RETURN;  -- a missing thread, and this write creates nothing of it
      END IF;
    END IF;
  END IF;
  IF v_owner = p_owner THEN
    RETURN;
  END IF;
  RAISE EXCEPTION USING ERRCODE = '{THREAD_UNAVAILABLE}', MESSAGE = 'the thread is unavailable to this owner',
    DETAIL = json_build_object('thread_id', p_thread, 'owner', p_owner)::text;
END $$"""


_V3_FUNCTIONS = (
    _own_function("EXISTS (SELECT 1 FROM cubepi_threads WHERE thread_id = p_thread)"),  # v3 asked only cubeloop
    # v2's append with the owner admission after cubeloop's lock, before the fence.
    f"""CREATE FUNCTION cubepi_tui_append(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_owner text, p_roles text[], p_metadata text[], p_payloads bytea[], p_run_ids text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  v_done text;
  v_last bigint;
BEGIN
  {_CLAIM}
  PERFORM pg_advisory_xact_lock(hashtext(p_thread));
  {_OWN}
  PERFORM cubepi_tui_fence(p_thread, p_holder, p_now);
  INSERT INTO cubepi_threads (thread_id) VALUES (p_thread) ON CONFLICT DO NOTHING;
  IF array_remove(p_run_ids, NULL) <> '{{}}' THEN  -- as cubeloop, only when a row names a run
    SELECT run_id INTO v_done FROM cubepi_runs WHERE thread_id = p_thread AND run_id = ANY(p_run_ids)
      AND completed_at IS NOT NULL ORDER BY run_id LIMIT 1;
  END IF;
  IF v_done IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '{RUN_COMPLETED}', MESSAGE = 'append to a completed run',
      DETAIL = json_build_object('thread_id', p_thread, 'run_id', v_done)::text;
  END IF;
  SELECT COALESCE(MAX(seq), 0) INTO v_last FROM cubepi_messages WHERE thread_id = p_thread;
  INSERT INTO cubepi_messages (thread_id, seq, role, metadata, payload, run_id)
    SELECT p_thread, v_last + u.ord, u.role, u.metadata::jsonb, u.payload, u.run_id
    FROM unnest(p_roles, p_metadata, p_payloads, p_run_ids) WITH ORDINALITY AS u(role, metadata, payload, run_id, ord)
    ORDER BY u.ord;
END $$""",
    # The owner admission, then the lesson's compare-and-set: one UPDATE of the record's
    # extra revision (WHERE revision = expected, when one is expected) whose row count must
    # be 1, then cubeloop's merge, in the statement's one transaction. Returns the new
    # revision; a retry of a write that committed returns what it returned (kept as text).
    f"""CREATE FUNCTION cubepi_tui_save_extra(p_write_id text, p_thread text, p_now float8, p_owner text,
  p_patch text, p_expected integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  v_revision integer;
BEGIN
  IF NOT cubepi_tui_claim_write(p_write_id, p_thread, p_now) THEN
    RETURN (SELECT result::integer FROM {WRITES} WHERE write_id = p_write_id);
  END IF;
  {_OWN}
  UPDATE {RECORDS} SET extra_revision = extra_revision + 1
    WHERE thread_id = p_thread AND (p_expected IS NULL OR extra_revision = p_expected)
    RETURNING extra_revision INTO v_revision;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '{REVISION_CONFLICT}', MESSAGE = 'the extra changed under this write',
      DETAIL = json_build_object('thread_id', p_thread, 'record', '{EXTRA_RECORD}', 'expected', p_expected,
        'actual', (SELECT extra_revision FROM {RECORDS} WHERE thread_id = p_thread))::text;
  END IF;
  INSERT INTO cubepi_threads (thread_id, extra, updated_at) VALUES (p_thread, p_patch::jsonb, now())
    ON CONFLICT (thread_id) DO UPDATE SET extra = cubepi_threads.extra || EXCLUDED.extra, updated_at = now()
    WHERE jsonb_typeof(cubepi_threads.extra) = 'object';
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '{EXTRA_NOT_OBJECT}', MESSAGE = 'the extra is not an object',
      DETAIL = json_build_object('thread_id', p_thread)::text;
  END IF;
  UPDATE {WRITES} SET result = v_revision::text WHERE write_id = p_write_id;
  RETURN v_revision;
END $$""",
    f"""CREATE FUNCTION cubepi_tui_tool_event(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_owner text, p_tool_call_id text, p_phase text, p_tool_name text, p_run_id text, p_job_key text, p_at float8)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  {_CLAIM}
  {_OWN}
  PERFORM cubepi_tui_fence(p_thread, p_holder, p_now);
  {_JOURNAL_UPSERT}
END $$""",
    f"""CREATE FUNCTION cubepi_tui_live_events(p_write_id text, p_thread text, p_now float8, p_owner text,
  p_run_id text, p_texts text[], p_keep integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  {_CLAIM}
  {_OWN}
  INSERT INTO {LIVE_EVENTS} (thread_id, run_id, data, at)
    SELECT p_thread, p_run_id, u.data, p_now FROM unnest(p_texts) WITH ORDINALITY AS u(data, ord) ORDER BY u.ord;
  IF p_keep <= 0 THEN
    DELETE FROM {LIVE_EVENTS} WHERE thread_id = p_thread;
    RETURN;
  END IF;
  DELETE FROM {LIVE_EVENTS} WHERE thread_id = p_thread AND seq <= (SELECT seq FROM {LIVE_EVENTS}
    WHERE thread_id = p_thread ORDER BY seq DESC OFFSET p_keep LIMIT 1);
END $$""",
    # The heartbeat: the admission without adoption (a renewal creates nothing), then the
    # holder's UPDATE, one revision more.
    f"""CREATE FUNCTION cubepi_tui_renew_lease(p_write_id text, p_thread text, p_now float8, p_holder text,
  p_owner text, p_heartbeat_at float8, p_expires_at float8, p_renewed text, p_not_renewed text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_result text;
BEGIN
  IF NOT cubepi_tui_claim_write(p_write_id, p_thread, p_now) THEN
    RETURN (SELECT result FROM {WRITES} WHERE write_id = p_write_id);
  END IF;
  PERFORM cubepi_tui_own(p_thread, p_owner, p_now, false);
  UPDATE {LEASES} SET heartbeat_at = p_heartbeat_at, expires_at = p_expires_at, revision = revision + 1
    WHERE thread_id = p_thread AND holder_id = p_holder;
  v_result := CASE WHEN FOUND THEN p_renewed ELSE p_not_renewed END;
  UPDATE {WRITES} SET result = v_result WHERE write_id = p_write_id;
  RETURN v_result;
END $$""",
)


async def _v3_owners(conn: Connection) -> None:
    """Owners, revisions, fingerprints and tool steps: the thread records and step tables,
    revision columns on leases, jobs and commands, and the write functions again, now
    taking the owner. Every thread already stored has no record: it is unowned."""
    for ddl in _V3_TABLES:
        await conn.execute(ddl)
    for signature in _V2_SIGNATURES:
        await conn.execute(f"DROP FUNCTION {signature}")
    for ddl in _V3_FUNCTIONS:
        await conn.execute(ddl)


# --- v4: every thread has a record --------------------------------------------------------------

EVERY_THREAD_RECORDED = 4
"""The schema version from which every thread has a row in the thread records."""

_V4_FUNCTIONS = (
    # A thread row cubeloop creates gets a record without owner (ours come with their
    # record: the admission runs before any write of ours makes the thread row).
    f"""CREATE FUNCTION cubepi_tui_record_thread() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {RECORDS} (thread_id) VALUES (NEW.thread_id) ON CONFLICT (thread_id) DO NOTHING;
  RETURN NULL;
END $$""",
    "CREATE TRIGGER cubepi_tui_record_thread AFTER INSERT ON cubepi_threads"
    " FOR EACH ROW EXECUTE FUNCTION cubepi_tui_record_thread()",
)


async def _v4_every_thread_recorded(conn: Connection) -> None:
    """Every thread gets a record, so an owner's threads (and the unowned ones) are found
    from the records' owner index alone, never by walking every owner's threads: one
    without owner for each thread already stored (they stay unowned), one by trigger for
    each thread row cubeloop creates. And the owner admission again, now counting a thread
    with rows only in our tables (one of before v3: a finished job, a pending command) as
    existing, so it stays unowned. No row of cubeloop's is changed."""
    await conn.execute(_own_function(thread_exists("p_thread"), "CREATE OR REPLACE"))
    for ddl in _V4_FUNCTIONS:
        await conn.execute(ddl)
    present = " UNION ".join(f"SELECT thread_id FROM {t}" for t in THREAD_TABLES)
    # The triggers on cubeloop's tables hold their locks until commit: no thread slips in between.
    await conn.execute(
        f"INSERT INTO {RECORDS} (thread_id) SELECT thread_id FROM ({present}) AS found"
        " WHERE thread_id IS NOT NULL ON CONFLICT (thread_id) DO NOTHING"
    )


MIGRATIONS: list[Callable[[Connection], Awaitable[None]]] = [
    _v1_our_tables,
    _v2_write_functions,
    _v3_owners,
    _v4_every_thread_recorded,
]
"""Ordered migrations: ``MIGRATIONS[i]`` brings our tables to version ``i + 1`` (v1 the
tables and triggers, v2 the one-statement write functions, v3 owners, revisions,
fingerprints and tool steps, v4 a record for every thread).

Each takes an asyncpg connection inside an open transaction; it adds, never rewrites a
row of cubeloop's. Append only; never reorder. Read at call time, so tests can add a step."""


INDEX_PLANS = "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off"
"""Sent first in a read transaction driven from :meth:`Scope.threads`: nested loops of index
probes from the owner's threads, whatever the statistics say. A hash or merge join, or a
sequential scan, would read every owner's rows, and its cost would show how many others have."""


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose rows a store reads: its ``owner`` (:data:`core.owners.UNOWNED` for the unowned
    scope) and our schema ``version`` in the database (``None``: none of ours), which says
    whether thread records exist to read the owner from (v3) and revision columns with them."""

    owner: str
    version: int | None

    @property
    def records(self) -> bool:
        """Whether the thread records (and the revision columns, the steps) exist."""
        return (self.version or 0) >= 3

    def owner_of(self, thread: str) -> str:
        """SQL for the owner of the thread ``thread`` names (a placeholder or a column): its
        record's, ``''`` without one (one primary-key probe). Without the records table every
        thread is unowned."""
        if not self.records:
            return "''"
        return f"coalesce((SELECT o.owner FROM {RECORDS} AS o WHERE o.thread_id = {thread}), '')"

    def visible(self, thread: str, owner: str) -> str:
        """SQL true when the thread ``thread`` names belongs to the owner bound at placeholder
        ``owner``: the predicate every read of a thread's rows carries in its own text."""
        return f"{self.owner_of(thread)} = {owner}"

    @property
    def recorded(self) -> bool:
        """Whether every thread has a record (v4): the owner's threads are then its records."""
        return (self.version or 0) >= EVERY_THREAD_RECORDED

    def threads(self, owner: str) -> str:
        """SQL of a subquery whose column ``thread_id`` lists every thread of the owner bound at
        placeholder ``owner``, for the reads of many threads (the listing, all leases): driven
        from it under :data:`INDEX_PLANS`, they do work for this owner's threads alone,
        however many threads others have. From v4 that is one scan of the records' owner
        index; before (browsing), the unowned scope also walks cubeloop's thread rows for
        the threads without a record (correct, slower, and only there)."""
        if not self.records:
            return f"SELECT thread_id FROM cubepi_threads WHERE '' = {owner}"
        if self.recorded or self.owner:
            return f"SELECT o.thread_id FROM {RECORDS} AS o WHERE {self.joined(owner, 'o')}"
        return (
            f"SELECT t.thread_id FROM cubepi_threads AS t LEFT JOIN {RECORDS} AS o ON o.thread_id = t.thread_id"
            f" WHERE {self.joined(owner, 'o')}"
        )

    def among(self, owner: str, ids: str) -> str:
        """SQL of a subquery like :meth:`threads`', of the thread ids in the ``text[]`` bound
        at placeholder ``ids`` that belong to the owner bound at ``owner`` (each once): the
        reads of a few named threads (the incremental listing), each id's owner asked as
        :meth:`visible` asks it."""
        return f"SELECT DISTINCT a.thread_id FROM unnest({ids}::text[]) AS a(thread_id) WHERE {self.visible('a.thread_id', owner)}"

    def mine(self, owner: str, ids: str | None) -> str:
        """:meth:`threads` when ``ids`` is ``None``, else :meth:`among` of the ``text[]`` at placeholder ``ids``."""
        return self.threads(owner) if ids is None else self.among(owner, ids)

    def exists(self, thread: str) -> str:
        """SQL true when the thread ``thread`` names has a row in cubeloop's thread table or
        in one of our per-thread tables this schema version has (:func:`thread_exists`)."""
        if self.version is None:
            return thread_exists(thread, ("cubepi_threads",))
        return thread_exists(thread, THREAD_TABLES if self.records else THREAD_TABLES[:-1])

    def joined(self, owner: str, record: str = "r") -> str:
        """The same predicate for a query that LEFT JOINed the thread record as ``record``:
        ``record.owner = owner`` for a named owner, ``record.owner IS NULL`` (no record, or
        one without an owner) for the unowned scope - forms the planner estimates from the
        column's statistics, so a listing of many threads keeps its hash joins."""
        if not self.records:
            return f"'' = {owner}"
        if self.owner:
            return f"{record}.owner = {owner}"
        return f"({record}.owner IS NULL AND {owner} = '')"

    def revision(self, alias: str = "") -> str:
        """The select-list item of a lease's, job's or command's revision: the column, or 1
        for rows of a database from before revisions (written once, as v3 counts them)."""
        return f"{alias}revision" if self.records else "1"


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
