"""Run exclusivity: one holder runs a thread at a time, proven by a lease it keeps renewing.

Every run (prompt, resume, follow-up run) first takes the thread's lease in the store,
then reloads the history, so two processes never act on the same stale view of a
thread. While the run lasts a background task renews the lease every
``heartbeat_interval`` seconds, pushing ``expires_at`` to ``now + ttl``; the lease is
released when the run ends. A lease is *stale*, and may be taken over, when it expired
(its holder stopped heartbeating: crashed, hung or asleep) or when its holder ran on
this host and that process no longer exists.

A holder is one :class:`LeaseHolder` (a uuid, the pid, the host id): by default each
``Agent`` is its own holder, so two agents of one process exclude each other too.

The host id (:func:`host_id`) is what every lease record names as its holder's host and
what "this host" means wherever a lease is judged: ``$CUBEPI_HOST_ID`` when set, else the
host name. Set it where host names are not unique (containers built from one image share
theirs, simulated hosts share the real one): a pid is only checked on its own host, so two
machines reporting one name would judge each other's pids, and a run on the other one
would read crashed while it still heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from core.checkpoint.base import Lease
from core.checkpoint.capabilities import Leases, ThreadDeletion
from core.errors import DatabaseGoneError, HostIdError, RunAlreadyClaimedError, error_sentence

_log = logging.getLogger(__name__)


HOST_ID_ENV = "CUBEPI_HOST_ID"
"""The environment variable naming this host in lease records (see :func:`host_id`)."""

HOST_ID_MAX = 255
"""The longest host id accepted, in characters: a DNS name's limit (RFC 1035 section 2.3.4),
so any real host name fits."""


def host_id() -> str:
    """This host's id in lease records: ``$CUBEPI_HOST_ID`` (surrounding spaces dropped)
    when set and not blank, else ``socket.gethostname()``.

    The one place a host is named: lease holders write it, and :func:`is_stale` and
    ``core.lease_status.lease_status`` compare a lease's host with it to decide whether its
    pid may be checked here. Read on every call, so it follows the environment. Raises
    :class:`~core.errors.HostIdError` when the variable holds a control character or more
    than :data:`HOST_ID_MAX` characters.
    """
    value = os.environ.get(HOST_ID_ENV, "").strip()
    if not value:
        return socket.gethostname()
    if len(value) > HOST_ID_MAX:
        raise HostIdError(f"{HOST_ID_ENV} must be at most {HOST_ID_MAX} characters long, not {len(value)}.")
    if not value.isprintable():
        raise HostIdError(f"{HOST_ID_ENV} must be printable text, not {value!r}.")
    return value


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a lease: ``holder_id`` (uuid hex, unique per holder), ``pid`` and ``host``
    (default :func:`host_id`, so may raise ``HostIdError``)."""

    holder_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=host_id)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (``os.kill(pid, 0)``).

    A process owned by another user counts as alive; a reused pid is indistinguishable
    from the original (the lease then waits for its expiry instead).
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def holder_gone(lease: Lease, *, host: str | None = None, alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether ``lease`` was taken on this ``host`` (default :func:`host_id`) by a process
    that no longer exists (``alive(pid)`` false; default :func:`pid_alive`). Always false
    for a lease of another host: its pid means nothing here. Raises ``HostIdError`` only
    when ``host`` is not given (see :func:`host_id`)."""
    return lease.host == (host or host_id()) and not alive(lease.pid)


def is_stale(
    lease: Lease, *, now: float | None = None, host: str | None = None, alive: Callable[[int], bool] = pid_alive
) -> bool:
    """Whether ``lease`` may be taken over: expired (``expires_at`` before ``now``, unix
    seconds), or :func:`holder_gone` (``host`` and ``alive`` as there). A lease of another
    host is judged by its expiry alone. The one staleness rule: a runner taking the lease
    and ``core.lease_status.lease_status`` (what the app shows) both ask it."""
    now = time.time() if now is None else now
    if lease.expires_at <= now:
        return True
    return holder_gone(lease, host=host, alive=alive)


def claimed_sentence(thread_id: str, lease: Lease | None) -> str:
    """The one sentence for a thread another holder runs right now."""
    if lease is None:
        return f"Thread {thread_id!r} is already running elsewhere; wait for that run to end or abort it there."
    until = time.strftime("%H:%M:%S", time.localtime(lease.expires_at))
    return (
        f"Thread {thread_id!r} is already running in process {lease.pid} on {lease.host} "
        f"(its lease is renewed until {until} unless it stops); wait for that run to end or abort it there."
    )


def deleted_sentence(thread_id: str) -> str:
    """The one sentence for a thread deleted: ``"Thread 'c1' deleted."`` (app and runner)."""
    return f"Thread {thread_id!r} deleted."


async def delete_thread(store: ThreadDeletion, thread_id: str) -> None:
    """Delete ``thread_id`` and everything stored for it (``ThreadDeletion.delete_thread``),
    refusing while a run holds it with :func:`core.checkpoint.base.not_deleted_sentence`: raises
    ``RunAlreadyClaimedError`` (its ``lease`` the store's) then, and what the store raises
    otherwise (``ThreadNotFoundError`` for a thread missing or another owner's,
    ``ReadOnlyStoreError``); nothing is deleted then. The runner's ``delete`` and the app's
    ``D`` both delete through here, so they say the same."""
    await store.delete_thread(thread_id)


class HeldLease:
    """A lease taken for one run: heartbeats in the background until :meth:`release`.

    ``lost`` is ``None`` while the lease is held, else the sentence saying why it was
    lost; ``on_lost()`` is called once when that happens: from the heartbeat task, or
    from :meth:`lose` when a fenced write found the lease gone first. The heartbeat gives
    up (the lease is lost) when renewals keep failing and the next attempt would come
    after the lease expires, so a run stops before another holder may take the thread.
    """

    def __init__(
        self,
        store: Leases,
        lease: Lease,
        *,
        ttl: float,
        interval: float,
        on_lost: Callable[[], None],
    ) -> None:
        self.store = store
        self.lease = lease
        self.ttl = ttl
        self.interval = interval
        self.lost: str | None = None
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def acquire(
        cls,
        store: Leases,
        thread_id: str,
        holder: LeaseHolder,
        run_id: str | None,
        *,
        ttl: float,
        interval: float,
        on_lost: Callable[[], None],
    ) -> HeldLease:
        """Take the thread's lease for ``holder`` and start heartbeating.

        Raises ``RunAlreadyClaimedError`` (with :func:`claimed_sentence` and ``lease``
        set to the live lease) when another holder runs the thread, and the store's errors.
        """
        now = time.time()
        wanted = Lease(thread_id, holder.holder_id, holder.pid, holder.host, run_id, now, now, now + ttl)
        try:
            lease = await store.acquire_lease(wanted, is_stale=lambda current: is_stale(current, host=holder.host))
        except RunAlreadyClaimedError as exc:
            current = exc.lease if isinstance(exc.lease, Lease) else None
            raise RunAlreadyClaimedError(claimed_sentence(thread_id, current), lease=current) from exc
        held = cls(store, lease, ttl=ttl, interval=interval, on_lost=on_lost)
        held._task = asyncio.create_task(held._beat(), name=f"lease heartbeat {thread_id}")
        return held

    async def _beat(self) -> None:
        lease = self.lease
        expires_at = lease.expires_at
        while self.lost is None:
            await asyncio.sleep(self.interval)
            if self.lost is not None:
                return
            now = time.time()
            try:
                held = await self.store.renew_lease(lease.thread_id, lease.holder_id, now, now + self.ttl)
            except DatabaseGoneError as exc:
                # Not a passing hitch: no later renewal can reach the file again.
                self.lose(error_sentence(exc))
                return
            except Exception as exc:
                # A store that is briefly busy costs nothing while the lease is still
                # ours; but if the next attempt would come after it expired, another
                # holder could take the thread while this run still writes.
                _log.warning("lease heartbeat of thread %s failed", lease.thread_id, exc_info=True)
                if time.time() + self.interval < expires_at:
                    continue
                self.lose(
                    f"This run could not renew its lease on thread {lease.thread_id!r} before it expired "
                    f"({type(exc).__name__}), so it stopped; another process may take the thread over."
                )
                return
            if not held:
                self.lose(
                    f"This run lost its lease on thread {lease.thread_id!r} (another process took the thread "
                    "over or the lease was removed), so it stopped without saving more."
                )
                return
            expires_at = now + self.ttl

    def lose(self, sentence: str) -> None:
        """Record that the lease is lost, saying why in ``sentence``, and call ``on_lost()``;
        only the first call counts. Heartbeats stop at their next turn."""
        if self.lost is not None:
            return
        self.lost = sentence
        try:
            self._on_lost()
        except Exception:
            _log.exception("lease-lost callback failed")

    async def release(self) -> None:
        """Stop heartbeating and drop the lease if we still hold it; never raises."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self.store.release_lease(self.lease.thread_id, self.lease.holder_id)
        except Exception:
            # It expires on its own within ttl seconds.
            _log.warning("could not release the lease of thread %s", self.lease.thread_id, exc_info=True)
