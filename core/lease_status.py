"""Where a thread runs: here, in another process (maybe another machine), crashed, or nowhere.

:func:`lease_status` reads a thread's lease record (:mod:`core.leases`) and its run records
into a :class:`LeaseView`: what the picker shows, what decides whether a thread may be
resumed, and what the app-side commands (:mod:`core.commands`) check before they queue
anything. Whether a lease is stale is :func:`core.leases.is_stale`'s rule, asked here, never
re-derived. How runs are supervised across processes is told in :mod:`core.supervisor`.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from core.checkpoint.base import Lease, RunRecord
from core.leases import holder_gone, host_id, is_stale, pid_alive


class LeaseState(enum.StrEnum):
    """What a thread's lease record says about it."""

    NONE = "none"
    """No lease: nobody runs the thread (or its runner released the lease when it ended)."""
    RUNNING_HERE = "running_here"
    """A live lease held by this process."""
    RUNNING_ELSEWHERE = "running_elsewhere"
    """A live lease held by another process (maybe another machine)."""
    CRASHED = "crashed"
    """The lease is stale (expired, or its holder's process on this host is gone) and its
    run never completed: the runner died. Only now may the thread be resumed."""
    ENDED = "ended"
    """The lease is stale but its run completed (the runner ended without releasing)."""


@dataclass(frozen=True, slots=True)
class LeaseView:
    """:func:`lease_status`'s verdict: ``state``, the ``lease`` it read, and at ``now``
    (unix seconds) the heartbeat's age and the seconds left until expiry (negative once
    expired). ``gone`` is true when the holder's process on this host no longer exists."""

    state: LeaseState
    lease: Lease | None = None
    heartbeat_age: float | None = None
    expires_in: float | None = None
    gone: bool = False

    @property
    def live(self) -> bool:
        """Whether someone runs the thread right now (here or elsewhere)."""
        return self.state in (LeaseState.RUNNING_HERE, LeaseState.RUNNING_ELSEWHERE)

    @property
    def may_resume(self) -> bool:
        """Whether a new run may take the thread: never while a live lease exists."""
        return not self.live

    def at(self, now: float) -> LeaseView:
        """This view of a run elsewhere, or of a crashed one, as it reads at ``now`` (unix
        seconds): the heartbeat's age and the time left (negative: since expiry) move on
        while no new heartbeat is read. The state is kept: whether the lease expired is
        decided from the store (:func:`lease_status`). Views in other states are returned
        unchanged."""
        if self.lease is None or self.state not in (LeaseState.RUNNING_ELSEWHERE, LeaseState.CRASHED):
            return self
        return replace(self, heartbeat_age=now - self.lease.heartbeat_at, expires_in=self.lease.expires_at - now)

    @property
    def label(self) -> str:
        """Short text for a list, naming the lease holder's host (cut to :data:`HOST_CHARS`):
        "running here", "running on build-7 (pid 412, beat 2 s ago)", "crashed on build-7
        (lease expired 40 s ago)", "crashed on build-7 (pid 412 gone)", else "not running".
        The host comes from the store: show it as untrusted text."""
        lease = self.lease
        if self.state is LeaseState.RUNNING_HERE:
            return "running here"
        if lease is None:
            return "not running"
        host = lease.host if len(lease.host) <= HOST_CHARS else lease.host[: HOST_CHARS - 1] + "…"
        if self.state is LeaseState.RUNNING_ELSEWHERE:
            return f"running on {host} (pid {lease.pid}, beat {_ago(self.heartbeat_age)})"
        if self.state is LeaseState.CRASHED:
            return f"crashed {self.crash_place}"
        return "not running"

    @property
    def crash_place(self) -> str:
        """Where and how a crashed lease's holder ended, to follow a crash's own words:
        "on build-7 (lease expired 40 s ago)", "on build-7 (pid 412 gone)"; empty unless
        the state is ``CRASHED``. The host is cut as in :attr:`label` and comes from the store."""
        lease = self.lease
        if self.state is not LeaseState.CRASHED or lease is None:
            return ""
        host = lease.host if len(lease.host) <= HOST_CHARS else lease.host[: HOST_CHARS - 1] + "…"
        why = f"pid {lease.pid} gone" if self.gone else f"lease expired {_ago(-(self.expires_in or 0.0))}"
        return f"on {host} ({why})"


HOST_CHARS = 20
"""A lease holder's host is cut to this many characters in :attr:`LeaseView.label`, so a
thread's state stays one short cell of the picker at 80 columns; sentences name it whole."""


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "at an unknown time"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _exists(_pid: int) -> bool:
    return True


def lease_status(
    lease: Lease | None,
    runs: Sequence[RunRecord] = (),
    now: float | None = None,
    *,
    host: str | None = None,
    pid: int | None = None,
    alive: Callable[[int], bool] = pid_alive,
) -> LeaseView:
    """Say whether a thread runs here, elsewhere, or crashed, from its ``lease`` record.

    ``runs`` are the thread's run records (to tell a crashed run from a completed one);
    ``now`` is unix seconds (default: now); ``host`` and ``pid`` say who "here" is
    (default: :func:`core.leases.host_id` and this process); ``alive(pid)`` probes a process
    on this host.

    Staleness is asked of :func:`core.leases.is_stale`, the rule that decides whether
    another runner may take the thread over: a lease is stale once ``expires_at <= now``,
    or at once when it was taken on this host by a process that no longer exists
    (:func:`core.leases.holder_gone`, which also gives ``gone``). A stale lease
    whose run did not complete is ``CRASHED``; a lease on another host therefore shows
    as running until it expires, even if that machine died, and even when a process of
    that pid is gone here. Pure apart from ``alive`` and reading the host id; raises only
    ``HostIdError`` (a bad ``CUBEPI_HOST_ID``).
    """
    if lease is None:
        return LeaseView(LeaseState.NONE)
    now = time.time() if now is None else now
    host = host_id() if host is None else host
    pid = os.getpid() if pid is None else pid
    age, left = now - lease.heartbeat_at, lease.expires_at - now
    here = lease.host == host and lease.pid == pid
    # This process exists by definition, whatever `alive` says of it.
    if not is_stale(lease, now=now, host=host, alive=_exists if here else alive):
        return LeaseView(LeaseState.RUNNING_HERE if here else LeaseState.RUNNING_ELSEWHERE, lease, age, left)
    gone = holder_gone(lease, host=host, alive=alive)
    run = next((r for r in runs if r.run_id == lease.run_id), None) if lease.run_id else None
    state = LeaseState.ENDED if run is not None and run.completed else LeaseState.CRASHED
    return LeaseView(state, lease, age, left, gone)
