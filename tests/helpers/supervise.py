"""Helpers for the subprocess tests: a runner child process paced by gate files, and waiting
on a follower's model or a command's status. Fixtures stay in ``tests/supervise/conftest.py``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.follow import ThreadFollower, ThreadModel

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (the runners' working directory)."""
TIMEOUT = 60.0
"""Seconds any wait may take before the test fails: generous, for a loaded 2-core machine."""


def runner_argv(db: str | os.PathLike[str], thread: str, *options: str) -> list[str]:
    """The command line of a headless runner (``cubepi-tui run``) on ``db`` (a store's location) and ``thread``,
    ``options`` after them (``--demo``, ``--agent MODULE:FUNCTION``, the prompt, ...)."""
    return [sys.executable, "-m", "core.runner", "run", "--db", str(db), "--thread", thread, *options]


class Runner:
    """A child process running one thread; ``gate(name)`` creates a gate file it waits for
    (the gated test agent ``tests.supervise.child`` waits for files in ``gates``). ``quiet``
    drops its stdout, for a child whose output nobody reads (a full pipe would block it);
    ``to_files`` sends stdout and stderr to files in ``gates`` instead of pipes, for a
    child that may write more than a pipe holds before :meth:`output` reads it."""

    def __init__(
        self,
        argv: list[str],
        gates: Path,
        env: dict[str, str] | None = None,
        *,
        quiet: bool = False,
        to_files: bool = False,
    ) -> None:
        self.gates = gates
        self._files: tuple[Path, Path] | None = None
        out: Any = subprocess.DEVNULL if quiet else subprocess.PIPE
        err: Any = subprocess.PIPE
        if to_files:
            # For a child that may write more than a pipe holds before anyone reads it.
            self._files = (gates / f"stdout-{time.monotonic_ns()}", gates / f"stderr-{time.monotonic_ns()}")
            out, err = (path.open("w") for path in self._files)
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "CUBEPI_TEST_GATES": str(gates), **(env or {})},
            stdout=out,
            stderr=err,
            text=True,
        )
        if to_files:
            out.close()
            err.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def gate(self, name: str) -> None:
        (self.gates / name).write_text("")

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def wait(self, timeout: float = TIMEOUT) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "the runner did not exit"
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) once the process ended."""
        out, err = self.proc.communicate(timeout=TIMEOUT)
        if self._files is not None:
            return self._files[0].read_text(), self._files[1].read_text()
        return out, err

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)

    async def file(self, name: str, timeout: float = TIMEOUT) -> Path:
        """Wait for the child to write the gate-directory file ``name``."""
        path = self.gates / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None:
                out, err = self.output()
                pytest.fail(f"the runner exited ({self.proc.returncode}) before writing {name}:\n{out}\n{err}")
            assert time.monotonic() < deadline, f"the runner never wrote {name}"
            await asyncio.sleep(0.02)
        return path


async def until(
    follower: ThreadFollower,
    predicate: Callable[[ThreadModel], Any],
    what: str,
    *,
    runner: Runner | None = None,
    timeout: float = TIMEOUT,
) -> Any:
    """Wait until ``predicate(follower.model)`` is truthy (checked after every change) and return it."""
    changed = asyncio.Event()
    unsubscribe = follower.subscribe(lambda _change: changed.set())
    deadline = time.monotonic() + timeout
    try:
        while True:
            result = predicate(follower.model)
            if result:
                return result
            if time.monotonic() > deadline:
                detail = ""
                if runner is not None and not runner.alive():
                    detail = "\n".join(runner.output())
                pytest.fail(f"timed out waiting for {what}; model: {_describe(follower.model)}\n{detail}")
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        unsubscribe()


def _describe(model: ThreadModel) -> str:
    return (
        f"{len(model.messages)} messages ({[m.role for m in model.messages]}), partial={model.partial is not None}, "
        f"tools={list(model.running_tools)}, lease={model.lease_view.label}, commands={[(c.kind, c.status) for c in model.commands]}"
    )


async def command_status(store: SQLiteCheckpointer, thread: str, seq: int) -> str:
    return next(c.status for c in await store.list_commands(thread) if c.seq == seq)


async def until_status(
    store: SQLiteCheckpointer, thread: str, seq: int, statuses: set[str], timeout: float = TIMEOUT
) -> list[str]:
    """Poll command ``seq`` until its status is in ``statuses``; return every status seen, in order."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        status = await command_status(store, thread, seq)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in statuses:
            return seen
        assert time.monotonic() < deadline, f"command {seq} stayed {seen}"
        await asyncio.sleep(0.01)


SIGKILL = signal.SIGKILL
SIGSTOP = signal.SIGSTOP
