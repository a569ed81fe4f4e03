"""SQLite files at an earlier schema version of ours, for the upgrade tests.

The schema is made by the real migrations, only the first ``version`` of them
(``sqlite_schema.migration`` with ``MIGRATIONS`` cut short), the way an older cubepi-tui
made it. The rows are written with plain ``sqlite3``, in the columns that version had: the
store of today writes through tables an older file does not have yet (the thread records
of v3), so it cannot stand in for the older program's writes.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from core.checkpoint import codec, sqlite_schema
from core.messages import AnyMessage


def write_older_file(
    path: Path,
    version: int,
    monkeypatch: pytest.MonkeyPatch,
    threads: dict[str, list[AnyMessage]],
    *,
    run_id: str = "r1",
) -> None:
    """Create ``path`` at our schema ``version`` holding ``threads`` (thread id -> messages):
    each thread's messages, an extra ``{"title": thread id}`` and a claimed run ``run_id``;
    from version 2 also a journal entry, a job, an expired lease, a live event and a pending
    command per thread, as that version's store wrote them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:version])
            sqlite_schema.migration(durable=False)(db)
        now = time.time()
        db.execute("BEGIN IMMEDIATE")
        for thread_id, messages in threads.items():
            db.executemany(
                "INSERT INTO messages (thread_id, message_json, run_id) VALUES (?, ?, ?)",
                [(thread_id, codec.encode(m), m.run_id) for m in messages],
            )
            db.execute(
                "INSERT INTO thread_extra (thread_id, extra_json) VALUES (?, ?)",
                (thread_id, codec.encode_extra({"title": thread_id})),
            )
            db.execute("INSERT INTO runs (thread_id, run_id) VALUES (?, ?)", (thread_id, run_id))
            if version < 2:
                continue
            db.execute(
                "INSERT INTO cubepi_tool_journal (thread_id, tool_call_id, tool_name, run_id, started_at)"
                " VALUES (?, 'c1', 'read', ?, ?)",
                (thread_id, run_id, now),
            )
            db.execute(
                "INSERT INTO cubepi_jobs (thread_id, key, status, started_at, attempts) VALUES (?, 'k1', 'started', ?, 1)",
                (thread_id, now),
            )
            db.execute(
                "INSERT INTO cubepi_leases (thread_id, holder_id, pid, host, run_id, acquired_at, heartbeat_at,"
                " expires_at) VALUES (?, 'old-holder', 1, 'box', ?, ?, ?, ?)",
                (thread_id, run_id, now - 100, now - 100, now - 85),
            )
            db.execute(
                "INSERT INTO cubepi_live_events (thread_id, run_id, data_json, at) VALUES (?, ?, ?, ?)",
                (thread_id, run_id, '{"type":"text_delta","delta":"hi"}', now),
            )
            db.execute(
                "INSERT INTO cubepi_commands (thread_id, kind, text, status, created_at, updated_at)"
                " VALUES (?, 'steer', 'go on', 'pending', ?, ?)",
                (thread_id, now, now),
            )
        db.execute("COMMIT")
    finally:
        db.close()
