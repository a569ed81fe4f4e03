"""The host id in lease records: ``CUBEPI_HOST_ID`` over the host name, one function for
writing and comparing it, and a pid judged only on its own host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from core.agent import Agent
from core.checkpoint.base import Lease, RunRecord
from core.checkpoint.memory import MemoryCheckpointer
from core.errors import HostIdError
from core.lease_status import HOST_CHARS, LeaseState, lease_status
from core.leases import HOST_ID_ENV, HOST_ID_MAX, LeaseHolder, host_id, is_stale, pid_alive
from core.providers.faux import FauxProvider

NOW = 1_800_000_000.0


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped (so it no longer exists here)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


def lease(host: str, pid: int, *, expires: float = NOW + 10) -> Lease:
    return Lease("t", "holder-1", pid, host, "r1", NOW - 60, NOW - 1, expires)


def test_the_host_name_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOST_ID_ENV, raising=False)
    assert host_id() == socket.gethostname()
    monkeypatch.setenv(HOST_ID_ENV, "   ")  # blank counts as unset
    assert host_id() == socket.gethostname()


def test_the_environment_overrides_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ID_ENV, " build-7 ")
    assert host_id() == "build-7"
    assert LeaseHolder().host == "build-7"
    monkeypatch.setenv(HOST_ID_ENV, "x" * HOST_ID_MAX)
    assert host_id() == "x" * HOST_ID_MAX


@pytest.mark.parametrize(
    ("value", "sentence"),
    [
        ("build\n7", r"CUBEPI_HOST_ID must be printable text, not 'build\\n7'\."),
        ("box\x1b[2J", r"CUBEPI_HOST_ID must be printable text"),
        ("x" * (HOST_ID_MAX + 1), rf"CUBEPI_HOST_ID must be at most {HOST_ID_MAX} characters long, not 256\."),
    ],
)
def test_a_host_id_that_cannot_name_a_host_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, sentence: str
) -> None:
    monkeypatch.setenv(HOST_ID_ENV, value)
    with pytest.raises(HostIdError, match=sentence):
        host_id()
    with pytest.raises(HostIdError):
        LeaseHolder()


def test_a_dead_pid_counts_only_on_the_host_named_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = dead_pid()
    record = lease("build-7", gone)
    monkeypatch.setenv(HOST_ID_ENV, "build-7")
    # This process is build-7: the holder's pid is checked here, and it is gone.
    assert is_stale(record, now=NOW)
    view = lease_status(record, [RunRecord("r1", NOW - 60)], NOW)
    assert view.state is LeaseState.CRASHED and view.gone and view.label == f"crashed on build-7 (pid {gone} gone)"
    # Same machine, same pid, but this process is another host now: only expiry counts.
    monkeypatch.setenv(HOST_ID_ENV, "build-8")
    assert not is_stale(record, now=NOW) and is_stale(record, now=NOW + 10)
    view = lease_status(record, [RunRecord("r1", NOW - 60)], NOW)
    assert view.state is LeaseState.RUNNING_ELSEWHERE and not view.gone
    assert view.label == f"running on build-7 (pid {gone}, beat 1 s ago)"
    expired = lease_status(record, [RunRecord("r1", NOW - 60)], NOW + 40)
    assert expired.state is LeaseState.CRASHED and expired.label == "crashed on build-7 (lease expired 30 s ago)"


def test_a_host_name_shared_by_simulated_hosts_means_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Containers from one image share a host name: with host ids set, a lease naming the
    # machine's name is another host's, even with this very pid, and a dead pid on it is
    # not looked up here (it may be another process's, or none): it runs until expiry.
    monkeypatch.setenv(HOST_ID_ENV, "container-b")
    name = socket.gethostname()
    assert lease_status(lease(name, os.getpid()), [], NOW).state is LeaseState.RUNNING_ELSEWHERE
    assert lease_status(lease(name, dead_pid()), [], NOW).state is LeaseState.RUNNING_ELSEWHERE
    assert lease_status(lease("container-b", os.getpid()), [], NOW).state is LeaseState.RUNNING_HERE


async def test_an_agent_writes_the_host_id_into_its_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ID_ENV, "build-7")
    store = MemoryCheckpointer()
    seen: list[Lease | None] = []

    async def look(_event: object) -> None:
        if not seen:
            seen.append(await store.get_lease("t"))

    agent = Agent(FauxProvider(["Done."]), store, "t")
    agent.subscribe(look)
    assert await agent.prompt("go") == "completed"
    assert seen and seen[0] is not None and (seen[0].host, seen[0].pid) == ("build-7", os.getpid())


def test_a_long_host_is_cut_in_the_label_only() -> None:
    host = "ip-10-0-3-17.eu-west-1.compute.internal"
    view = lease_status(lease(host, 42), [], NOW, host="here", alive=lambda pid: True)
    cut = host[: HOST_CHARS - 1] + "…"
    assert view.label == f"running on {cut} (pid 42, beat 1 s ago)" and view.lease is not None
    assert view.lease.host == host
