"""One open Redis store: its connection, how it was opened (read-write, new, browse-only),
its upgrade, and the reconnecting call every store method goes through.

:class:`RedisStore` is the base of :class:`~core.checkpoint.redis.RedisCheckpointer`,
which adds the store's methods.

Connections. One redis-py asyncio client (a pool: concurrent calls use separate
connections) with ``socket_timeout`` (15 s by default) and redis-py's own retries off:
every call goes through :func:`core.checkpoint.reconnect.with_reconnect`, which retries a
lost connection with its one backoff and tells ``on_status``. A connection error is
redis-py's ``ConnectionError`` (not ``AuthenticationError``) or ``TimeoutError``, or an
``OSError``. Writes carry a write id checked inside their script or transaction, so a
write whose reply was lost is not made twice on retry.

Owners. A store is opened for one owner (:func:`core.owners.resolve_owner`); every script
it runs is given that owner and checks the thread's record against it on the server (see
:mod:`core.checkpoint.redis_scripts`), so nothing of another owner's thread reaches Python.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ReadOnlyError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.checkpoint import redis_records as records
from core.checkpoint import redis_schema as schema
from core.checkpoint import redis_scripts as scripts
from core.checkpoint.addresses import UNREACHABLE
from core.checkpoint.base import check_lease_holder, thread_unavailable
from core.checkpoint.reconnect import RECONNECT_DELAYS, OnStatus, with_reconnect
from core.checkpoint.redis_keys import WRITE_MEMORY, Keys, split_url
from core.errors import CheckpointError, DatabaseOpenError, ReadOnlyStoreError, SchemaError
from core.owners import resolve_owner

T = TypeVar("T")

KEEP = object()
"""What a :meth:`RedisStore._cas` decision returns to write nothing."""

SOCKET_TIMEOUT = 15.0
"""Seconds a command may wait for its reply before the connection counts as dead."""

CONNECT_TIMEOUT = 5.0
"""Seconds to establish a connection (a server that is down refuses at once; this bounds a black hole)."""


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the connection broke (retried) rather than the command failed."""
    if isinstance(error, AuthenticationError):
        return False
    return isinstance(error, (RedisConnectionError, RedisTimeoutError, OSError))


def now_arg() -> str:
    """Now, unix seconds, as the exact text Lua's ``tonumber`` reads back to the same double."""
    return repr(time.time())


def write_id() -> str:
    """A fresh id for one write (see :data:`core.checkpoint.redis_keys.WRITE_MEMORY`)."""
    return uuid.uuid4().hex


class RedisStore:
    """An open Redis store and its mode; use :meth:`open` (a subclass gets its own type back)."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        where: str,
        version: int | None,
        *,
        writable: bool,
        on_status: OnStatus | None,
        socket_timeout: float,
        client_url: str,
        client_name: str,
        owner: str,
        reconnect_delays: Sequence[float] = RECONNECT_DELAYS,
    ) -> None:
        """Internal: use :meth:`open`."""
        self._owner = owner
        self._before_commit: Callable[[str], object] | None = None
        """Test seam, private: when set, called with the write's name (``"extra"``,
        ``"step"``) after every check made in Python and right before the one script that
        checks again and writes (``EVALSHA``); an awaitable it returns is awaited. A script
        runs whole or not at all and Redis has no rollback, so this is where a crash
        "between the update and the commit" can happen: an exception raised here, or the
        process killed here, leaves the store as it was."""
        self._reconnect_delays = tuple(reconnect_delays)
        self._client: Redis | None = client
        self._keys = keys
        self._where = where
        self._version = version
        self._writable = writable
        self._on_status = on_status
        self._socket_timeout = socket_timeout
        self._client_url = client_url
        self._client_name = client_name
        self._scripts = {name: client.register_script(getattr(scripts, name)) for name in scripts.NAMES}

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        create: bool = True,
        on_status: OnStatus | None = None,
        prefix: str | None = None,
        socket_timeout: float = SOCKET_TIMEOUT,
        reconnect_delays: Sequence[float] = RECONNECT_DELAYS,
        owner: str | None = None,
    ) -> Self:
        """Open the store at ``url`` (``redis://[user:password@]host:port/db``, ``rediss://``
        or ``unix://``) under a key prefix: ``prefix`` when given, else the URL's ``prefix``
        query parameter (``redis://host:6379/0?prefix=team:``), else ``cubepi:``.

        * our schema at the version this code knows: read-write;
        * nothing under the prefix: with ``create`` our schema version is recorded
          (read-write); without, ``DatabaseOpenError``;
        * CubePi's example layout (keys under the prefix, no version of ours) or an older
          version of ours: browse-only (``needs_upgrade``) until :meth:`upgrade`;
        * a newer version: ``SchemaError``.

        ``socket_timeout`` (seconds) bounds the wait for each reply; a blocking read of the
        change feed always blocks for less (see ``change_signals``). ``on_status`` hears of
        each reconnect attempt and of the store being back; ``reconnect_delays`` (seconds)
        are a call's waits before each retry (:func:`core.checkpoint.reconnect.delays_within`
        makes shorter ones). ``owner`` is whose threads the store reads and writes
        (:func:`core.owners.resolve_owner`: ``None`` the default owner, ``UNOWNED`` the
        unowned scope). Raises ``DatabaseOpenError``
        (one sentence, never the password) for a bad URL or a server that cannot be reached
        (one attempt: opening does not wait out an outage), ``ValueError`` (one sentence)
        for an owner name :func:`core.owners.check_owner` refuses.
        """
        chosen_owner = resolve_owner(owner)
        client_url, chosen, where = split_url(url, prefix)
        name = f"cubepi-tui-{uuid.uuid4().hex[:12]}"
        try:
            client = Redis.from_url(
                client_url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=CONNECT_TIMEOUT,
                retry=Retry(NoBackoff(), 0),
                client_name=name,
            )
        except (ValueError, TypeError) as error:
            raise DatabaseOpenError(f"{where} is not a usable Redis URL ({_one_line(error)}).") from None
        keys = Keys(chosen)
        try:
            version, writable = await _mode(client, keys, where, create=create)
        except BaseException as error:
            await client.aclose()
            if isinstance(error, CheckpointError):
                raise
            if is_connection_error(error):
                raise DatabaseOpenError(f"Cannot open the Redis store at {where}: {UNREACHABLE}.") from None
            if isinstance(error, RedisError):
                raise DatabaseOpenError(f"Cannot open the Redis store at {where}: {_one_line(error)}.") from None
            raise
        return cls(
            client,
            keys,
            where,
            version,
            writable=writable,
            on_status=on_status,
            socket_timeout=socket_timeout,
            client_url=client_url,
            client_name=name,
            owner=chosen_owner,
            reconnect_delays=reconnect_delays,
        )

    async def upgrade(self) -> None:
        """Make a browse-only store writable: add our keys (or migrate older ones) in one
        ``MULTI``/``EXEC`` (see :func:`core.checkpoint.redis_schema.upgrade`). Call only after
        the user agreed; the example's keys are never changed. A no-op on a writable store.
        Raises ``SchemaError`` when another program upgraded it past this version meanwhile,
        ``DatabaseOpenError`` when the server refuses writes."""
        if self._writable:
            return
        client = self._live_client()
        try:
            version = await self._call("upgrade", lambda: schema.upgrade(client, self._keys))
        except ReadOnlyStoreError as error:
            raise DatabaseOpenError(f"The store at {self._where} cannot be upgraded: {error}") from None
        if version > schema.current():
            raise SchemaError(_newer(self._where, self._keys, version))
        self._version = version
        self._writable = True

    # --- state ---------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        """See ``OwnerScoped.owner``."""
        return self._owner

    @property
    def where(self) -> str:
        """The server's URL without password or query (``redis://host:6379/0``)."""
        return self._where

    @property
    def prefix(self) -> str:
        """The key prefix every key of this store starts with."""
        return self._keys.prefix

    @property
    def client_name(self) -> str:
        """The ``CLIENT SETNAME`` of this store's connections (shown by ``CLIENT LIST``)."""
        return self._client_name

    @property
    def needs_upgrade(self) -> bool:
        """True for a store of the example's layout or an older schema of ours (browse-only)."""
        return not self._writable

    @property
    def read_only(self) -> bool:
        """True while writes raise ``ReadOnlyStoreError``."""
        return not self._writable

    @property
    def schema_version(self) -> int | None:
        """Our schema version in the store, ``None`` for the example's layout."""
        return self._version

    async def close(self) -> None:
        """Close the connections; idempotent."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing ------------------------------------------------------------------------

    def _live_client(self) -> Redis:
        if self._client is None:
            raise CheckpointError(f"The store at {self._where} is closed.")
        return self._client

    def _check_writable(self) -> None:
        """Raise ``ReadOnlyStoreError`` unless writes are allowed."""
        if not self._writable:
            raise ReadOnlyStoreError(
                f"The store at {self._where} under the prefix {self._keys.prefix!r} is open for browsing only;"
                " upgrade it before writing to it."
            )

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call`` through :func:`with_reconnect`; a command the server refuses becomes one sentence."""
        self._live_client()
        try:
            return await with_reconnect(
                call,
                what=what,
                where=self._where,
                is_connection_error=is_connection_error,
                on_status=self._on_status,
                delays=self._reconnect_delays,
            )
        except ReadOnlyError:
            raise ReadOnlyStoreError(f"The Redis server at {self._where} is read-only (a replica?).") from None
        except RedisError as error:
            if isinstance(error, CheckpointError):
                raise
            raise CheckpointError(f"The {what} on {self._where} failed: {_one_line(error)}.") from None

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> list[bytes | None]:
        """Run one of :mod:`~core.checkpoint.redis_scripts` (EVALSHA, loading it when the server lost it)."""
        return await self._scripts[name](keys=keys, args=args, client=self._live_client())

    def _write_args(self, wid: str) -> tuple[str, int]:
        return self._keys.write(wid), WRITE_MEMORY

    def _lease_lost(self, thread_id: str, holder_id: str, raw: bytes | None, now: str) -> NoReturn:
        """Raise the fence's ``LeaseLostError`` for the lease record a script refused on."""
        check_lease_holder(records.decode_lease(raw), thread_id, holder_id, float(now))
        raise CheckpointError(f"The lease check of thread {thread_id!r} on {self._where} gave two answers.")

    def _unavailable(self, thread_id: str) -> NoReturn:
        """Raise the one error for a thread that is missing or another owner's."""
        raise thread_unavailable(thread_id, self._owner)

    async def _read(self, what: str, thread_id: str, key: str, command: str, *args: Any) -> Any:
        """``command`` (``HGET``, ``HMGET``, ``HGETALL`` or ``XRANGE``) on ``key`` of
        ``thread_id``, made by the ``READ`` script only when the thread's record names this
        store's owner; ``None`` otherwise, as for a missing key. The reply is the server's
        (a flat list for ``HGETALL``, nested lists for ``XRANGE``)."""
        keys = [self._keys.record(thread_id), key]
        return await self._call(what, lambda: self._script("READ", keys, [self._owner, command, *args]))

    async def _at_commit(self, what: str) -> None:
        """Run the test seam ``_before_commit`` (see ``__init__``), if set."""
        hook = self._before_commit
        if hook is not None:
            result = hook(what)
            if inspect.isawaitable(result):
                await result

    async def _cas(
        self,
        what: str,
        hash_key: str,
        field: str,
        decide: Callable[[bytes | None], str | object | None],
        *,
        thread_id: str | Callable[[bytes], str],
        holder_id: str | None = None,
        touch: bool = False,
    ) -> bytes | str | None:
        """Compare-and-set one hash field and return what it holds afterwards.

        ``decide(current)`` (the field's bytes, ``None`` when absent) returns the new JSON
        text, ``None`` to delete it, :data:`KEEP` to write nothing, or an exception to
        raise; it runs again whenever another writer changed the field first. The write is
        fenced by ``holder_id`` (checked even when nothing is written, as every fenced call
        is), adds to the change feed and, with ``touch``, bumps the thread in this owner's
        listing.

        ``thread_id`` is the thread the field belongs to: the read (the ``FIELD`` script)
        and the write (``CAS``) both check its owner on the server, and raise
        ``ThreadNotFoundError`` for another owner's thread, before ``decide`` sees
        anything. For a field of a hash kept per owner (:meth:`~core.checkpoint.redis_keys.Keys.commands`)
        it is instead a function giving the thread from the field's value: the field is read
        from this owner's own hash, and the write checks that thread's owner.
        """
        client = self._live_client()
        marker, ttl = self._write_args(write_id())

        async def attempt() -> bytes | str | None:
            while True:
                if isinstance(thread_id, str):
                    tid: str | None = thread_id
                    got = await self._script(
                        "FIELD", [*self._keys.scope(thread_id), hash_key], [thread_id, self._owner, field]
                    )
                    if got[0] == b"unavailable":
                        self._unavailable(thread_id)
                    current = got[1] if len(got) > 1 else None
                else:
                    tid = None
                    current = await client.hget(hash_key, field)
                new = decide(current)
                refusal = new if isinstance(new, BaseException) else None
                if (new is KEEP or refusal is not None) and holder_id is None:
                    if refusal is not None:
                        raise refusal
                    return current
                if tid is None:
                    assert current is not None and not isinstance(thread_id, str)  # decide refuses a missing one
                    tid = thread_id(current)
                op = "keep" if new is KEEP or refusal is not None else ("del" if new is None else "set")
                now = now_arg()
                k = self._keys
                reply = await self._script(
                    "CAS",
                    [*k.scope(tid), hash_key, k.leases(self._owner), k.changes, marker, k.index(self._owner)],
                    [
                        tid,
                        self._owner,
                        field,
                        "0" if current is None else "1",
                        current or b"",
                        op,
                        new if op == "set" else "",
                        holder_id or "",
                        now,
                        ttl,
                        "1" if touch else "0",
                    ],
                )
                kind = reply[0]
                if kind == b"conflict":
                    continue
                if kind == b"unavailable":
                    self._unavailable(tid)
                if kind == b"lease":
                    self._lease_lost(tid, holder_id or "", reply[1], now)
                if kind == b"dup":
                    return reply[1] or None
                if refusal is not None:
                    raise refusal
                return current if op == "keep" else (new if op == "set" else None)  # type: ignore[return-value]

        return await self._call(what, attempt)


async def _mode(client: Redis, keys: Keys, where: str, *, create: bool) -> tuple[int | None, bool]:
    """``(version, writable)`` of the store under ``keys.prefix``, creating it when allowed."""
    version = await schema.read_version(client, keys, where)
    if version is None and await schema.anything_under(client, keys):
        # Our program records the version before writing any other key, so keys seen after
        # a missing version may be another process's fresh store: read the version again
        # before calling the store the example's layout (a 4-writer CI run hit this).
        version = await schema.read_version(client, keys, where)
    elif version is None:
        if not create:
            raise DatabaseOpenError(f"There is no agent store at {where} under the prefix {keys.prefix!r}.")
        if await schema.create(client, keys):
            return schema.current(), True
        version = await schema.read_version(client, keys, where)  # another program created it first
    if version is not None and version > schema.current():
        raise SchemaError(_newer(where, keys, version))
    return version, version == schema.current()


def _newer(where: str, keys: Keys, version: int) -> str:
    return (
        f"The store at {where} under the prefix {keys.prefix!r} was written by a newer cubepi-tui "
        f"(schema version {version}, this one knows up to {schema.current()}); update cubepi-tui to open it."
    )


def _one_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(error).__name__
