"""The Redis key scheme of :class:`~core.checkpoint.redis.RedisCheckpointer`, in one place,
and the store URL (its ``prefix`` query parameter, and the URL shown without a password).

CubePi's custom-backend example (the layout every such store has):

* ``{prefix}msgs:{thread_id}`` - a list of message JSON, RPUSH order = append order;
* ``{prefix}extra:{thread_id}`` - a string holding the thread's extra JSON object.

Ours, beside them under ``{prefix}tui:`` (added by :meth:`~core.checkpoint.redis.RedisCheckpointer.upgrade`
or when a new store is created):

* ``tui:schema`` - our schema version (a decimal string);
* ``tui:rec:{thread_id}`` - hash: the thread's own record (schema v3): ``owner`` (absent for
  a thread that records none: :data:`core.owners.UNOWNED`), ``created_at``, ``fp`` the
  fingerprints JSON and ``rev`` their revision, ``ovr`` the overrides (a JSON array), ``xrev``
  the extra's revision. A thread of the example's layout, or of ours before v3, has none;
* ``tui:threads`` - sorted set: thread id -> last activity (unix seconds), the listing index
  of the unowned threads (before v3: of every thread); ``tui:threads:{owner}`` a named owner's;
* ``tui:first`` - hash: thread id -> the text of its first user message (schema v2);
* ``tui:runs:{thread_id}`` - hash: run id -> run record JSON;
* ``tui:pending`` - hash: thread id -> pending human request JSON;
* ``tui:answers:{thread_id}`` - hash: one field per answered question (:func:`answer_field`:
  the run's id, length-prefixed, then the question id) -> the answer JSON, written once;
* ``tui:journal:{thread_id}`` / ``tui:jobs:{thread_id}`` - hashes: tool call id / job key -> JSON;
* ``tui:steps:{thread_id}`` - hash: the thread's step records (schema v3), one field per
  column and job key (``w:{key}`` the workflow, ``r:{key}`` the revision, ...; see
  :data:`STEP_FIELDS`), so one script checks and updates a record's columns in place;
* ``tui:leases`` - hash: thread id -> lease JSON, of the unowned threads (before v3: of every
  thread); ``tui:leases:{owner}`` a named owner's;
* ``tui:live:{thread_id}`` - a stream of live events, ids ``0-{seq}`` from the counter ``tui:liveseq``;
* ``tui:cmds`` - hash: seq -> command JSON, of the unowned threads (before v3: of every thread),
  ``tui:owncmds:{owner}`` a named owner's; ``tui:cmdseq`` their one counter;
  ``tui:cmds:{thread_id}`` a sorted set of the thread's command seqs;
* ``tui:changes`` - a stream every write of ours adds an entry to (the change feed);
* ``tui:w:{write_id}`` - the reply of a write already made (expires), so a write whose
  reply was lost is found on retry instead of made twice.

Owners. The store-wide collections a listing or a command's seq reads (the index, the
leases, the commands) are kept per owner, so each owner's reads touch only its own: the
unowned scope's are the keys of before v3, which is how every earlier thread becomes
unowned without a key being rewritten. The per-thread keys are shared; every script checks
the thread's ``tui:rec`` owner before it reads or writes them.

Only :mod:`core.checkpoint.redis` and its ``redis_*`` helpers import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.checkpoint.addresses import port_problem
from core.checkpoint.redact import redacted
from core.errors import DatabaseOpenError
from core.owners import UNOWNED

DEFAULT_PREFIX = "cubepi:"
"""The key prefix of CubePi's custom-backend example."""

WRITE_MEMORY = 600
"""Seconds a write's reply is remembered under ``tui:w:{write_id}``: far longer than one
call's reconnect window (26.3 s, :data:`core.checkpoint.reconnect.RECONNECT_DELAYS`)."""

CHANGES_KEEP = 1000
"""Entries the change feed keeps (``XADD MAXLEN ~``); readers need only the newest id."""

STEP_FIELDS = {
    "i": "input_fingerprint",
    "w": "workflow",
    "n": "next_step",
    "t": "total_steps",
    "r": "revision",
    "d": "data",
    "c": "tool_call_id",
    "u": "updated_at",
}
"""The columns of a step record as fields ``{letter}:{key}`` of ``tui:steps:{thread_id}``
(``t``, ``d`` and ``c`` absent for none; ``d`` is the data's JSON text)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """Every key of one store, built from its ``prefix`` (``cubepi:`` by default)."""

    prefix: str

    def msgs(self, thread_id: str) -> str:
        """The example's message list of a thread."""
        return f"{self.prefix}msgs:{thread_id}"

    def extra(self, thread_id: str) -> str:
        """The example's extra JSON object of a thread."""
        return f"{self.prefix}extra:{thread_id}"

    def _tui(self, name: str) -> str:
        return f"{self.prefix}tui:{name}"

    @property
    def schema(self) -> str:
        """Our schema version."""
        return self._tui("schema")

    def record(self, thread_id: str) -> str:
        """The thread's own record: owner, created_at, fingerprints, revisions (hash)."""
        return self._tui(f"rec:{thread_id}")

    def scope(self, thread_id: str) -> list[str]:
        """The keys a script's owner check reads, its ``KEYS[1..11]``: every key that can
        hold anything of the thread - its record, message list, extra, runs, the
        pending-request hash, its journal, jobs, steps, live events and command index, and
        the unowned scope's lease hash (a named owner's leases come with its record). A
        thread with none of them does not exist; see :mod:`core.checkpoint.redis_scripts`."""
        return [
            self.record(thread_id),
            self.msgs(thread_id),
            self.extra(thread_id),
            self.runs(thread_id),
            self.pending,
            self.journal(thread_id),
            self.jobs(thread_id),
            self.steps(thread_id),
            self.live(thread_id),
            self.thread_commands(thread_id),
            self.leases(UNOWNED),
        ]

    def index(self, owner: str) -> str:
        """The listing index of ``owner``'s threads (sorted set by last activity); the
        unowned scope's is the index of before v3."""
        return self._tui("threads") if owner == UNOWNED else self._tui(f"threads:{owner}")

    @property
    def first(self) -> str:
        """Thread id -> first user prompt (hash)."""
        return self._tui("first")

    def runs(self, thread_id: str) -> str:
        """Run id -> run record (hash)."""
        return self._tui(f"runs:{thread_id}")

    @property
    def pending(self) -> str:
        """Thread id -> pending human request (hash)."""
        return self._tui("pending")

    def answers(self, thread_id: str) -> str:
        """The thread's human answers (hash, fields by :func:`answer_field`)."""
        return self._tui(f"answers:{thread_id}")

    def journal(self, thread_id: str) -> str:
        """Tool call id -> journal entry (hash)."""
        return self._tui(f"journal:{thread_id}")

    def jobs(self, thread_id: str) -> str:
        """Job key -> job record (hash)."""
        return self._tui(f"jobs:{thread_id}")

    def steps(self, thread_id: str) -> str:
        """The thread's step records, a field per column and key (hash, see :data:`STEP_FIELDS`)."""
        return self._tui(f"steps:{thread_id}")

    def leases(self, owner: str) -> str:
        """Thread id -> lease of ``owner``'s threads (hash); the unowned scope's is that of before v3."""
        return self._tui("leases") if owner == UNOWNED else self._tui(f"leases:{owner}")

    def live(self, thread_id: str) -> str:
        """The thread's live-event stream."""
        return self._tui(f"live:{thread_id}")

    @property
    def live_seq(self) -> str:
        """The store's live-event counter."""
        return self._tui("liveseq")

    def commands(self, owner: str) -> str:
        """Seq -> command of ``owner``'s threads (hash); the unowned scope's is that of before v3."""
        return self._tui("cmds") if owner == UNOWNED else self._tui(f"owncmds:{owner}")

    @property
    def command_seq(self) -> str:
        """The store's command counter."""
        return self._tui("cmdseq")

    def thread_commands(self, thread_id: str) -> str:
        """The thread's command seqs (sorted set)."""
        return self._tui(f"cmds:{thread_id}")

    @property
    def changes(self) -> str:
        """The change feed (stream)."""
        return self._tui("changes")

    def write(self, write_id: str) -> str:
        """The remembered reply of one write."""
        return self._tui(f"w:{write_id}")

    def pattern(self, kind: str) -> str:
        """A SCAN ``MATCH`` pattern for the example's ``kind`` keys (``msgs`` / ``extra``),
        with the glob characters of the prefix escaped; ``""`` gives every key under the prefix."""
        escaped = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in self.prefix)
        return f"{escaped}{kind}:*" if kind else f"{escaped}*"

    def thread_of(self, key: bytes | str, kind: str) -> str:
        """The thread id in a ``msgs``/``extra`` key found by :meth:`pattern`."""
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(self.prefix) + len(kind) + 1 :]


def answer_prefix(run_key: str) -> str:
    """The start of every answer field of run ``run_key`` (``''`` for none): its length,
    ``:``, the id, so no run's prefix is another's and any text can follow."""
    return f"{len(run_key)}:{run_key}"


def answer_field(run_key: str, question_id: str) -> str:
    """The ``tui:answers`` field of ``question_id`` of run ``run_key``. The scripts that
    read a pending request build the same field in Lua (``answer_stored`` of
    :data:`core.checkpoint.redis_scripts.PENDING_OF`), counting the run key's characters
    as ``len`` does; tests/core/checkpoint/test_contract_answers.py holds the two together."""
    return answer_prefix(run_key) + question_id


def split_url(url: str, prefix: str | None) -> tuple[str, str, str]:
    """``(url for redis-py, key prefix, where)`` from a store URL.

    The prefix is ``prefix`` when given, else the URL's ``prefix`` query parameter
    (``redis://host:6379/0?prefix=team:``), else ``cubepi:``; the parameter is removed
    from the URL handed to redis-py, which would refuse it. ``where`` is the URL without
    its password or query, for messages. Raises ``DatabaseOpenError`` (one sentence) for
    a URL that is not ``redis://``, ``rediss://`` or ``unix://``, a port that is not a
    port number (:func:`core.checkpoint.addresses.port_problem`), a ``redis://`` URL
    without a host or a ``unix://`` one without a socket path (redis-py would quietly use
    localhost), and a database - the path, or the ``db`` parameter - that is not a
    non-negative integer (redis-py would quietly use database 0 for ``/abc``, and 1 for ``/0/1``).
    """
    where = _masked(url)
    problem = port_problem(url)
    if problem is not None:
        raise DatabaseOpenError(f"Cannot open the Redis store at {where}: {problem}.")
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        _ = parts.port  # checks the port: a bad one raises ValueError here
    except ValueError:
        raise DatabaseOpenError(f"{where} is not a Redis URL (redis://host:port/db).") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise DatabaseOpenError(f"{where} is not a Redis URL (redis://host:port/db).")
    if parts.scheme == "unix" and not parts.path:
        raise DatabaseOpenError(
            f"Cannot open the Redis store at {where}: the URL names no socket (unix:///path/to/redis.sock)."
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise DatabaseOpenError(
            f"Cannot open the Redis store at {where}: the URL names no host (redis://host:6379/0, or"
            " unix:///path/to/redis.sock for a socket)."
        )
    databases = [v for k, v in query if k == "db"] + ([] if parts.scheme == "unix" else [parts.path.removeprefix("/")])
    for database in databases:
        if database and not (database.isascii() and database.isdigit()):
            raise DatabaseOpenError(
                f"Cannot open the Redis store at {where}: the database must be a non-negative integer"
                f" such as /0, not {database!r}."
            )
    from_query = [v for k, v in query if k == "prefix"]
    rest = [(k, v) for k, v in query if k != "prefix"]
    chosen = prefix if prefix is not None else (from_query[-1] if from_query else DEFAULT_PREFIX)
    client_url = urlunsplit(parts._replace(query=urlencode(rest)))
    if parts.scheme == "unix" and not parts.netloc:
        # urlunsplit drops an empty authority ("unix:/run/redis.sock"), and redis-py 8.2
        # accepts a socket URL only in the form "unix://" + path.
        client_url = "unix://" + client_url.removeprefix("unix:")
    return client_url, chosen, where


def _masked(url: str) -> str:
    """``url`` without its password or query, for an error about the URL itself
    (the password rule is :func:`core.checkpoint.redact.redacted`)."""
    return redacted(url).split("?", 1)[0]
