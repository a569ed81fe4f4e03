"""Fixtures for the subprocess tests: runner children on a database file, and the test
process's own store on it. The helpers live in ``tests/helpers/supervise.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from tests.helpers.supervise import Runner, runner_argv


@pytest.fixture
def spawn(tmp_path: Path):
    """``spawn(thread, prompt, *runner_args, env=..., via=...)`` starts a runner on ``db``;
    every runner still alive at the end of the test is killed."""
    runners: list[Runner] = []
    gates = tmp_path / "gates"
    gates.mkdir()

    def start(
        db: Path, thread: str, *args: str, env: dict[str, str] | None = None, argv: list[str] | None = None
    ) -> Runner:
        command = argv or runner_argv(db, thread, "--agent", "tests.supervise.child:make_agent", *args)
        runner = Runner(command, gates, env or {})
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        runner.kill()
        for stream in (runner.proc.stdout, runner.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
async def db(tmp_path: Path):
    """A fresh database file (created here, so runner and test never race to create it)."""
    path = tmp_path / "threads.sqlite"
    store = await SQLiteCheckpointer.open(path, create=True)
    await store.close()
    return path


@pytest.fixture
async def store(db: Path):
    """The test process's own connection to ``db``."""
    opened = await SQLiteCheckpointer.open(db, create=False)
    yield opened
    await opened.close()
