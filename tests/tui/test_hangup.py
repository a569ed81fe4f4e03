"""Closing the terminal during a run: the app aborts and saves the run and the process ends.

A real terminal is needed (a hung-up pty fails writes with EIO and reads end-of-file, which
Pilot cannot imitate), so the app runs in a private tmux server, and killing that server
hangs the terminal up exactly as closing a window does. Before the fix the process stayed
alive for good, blocked writing to the dead terminal (one spun at 100% CPU).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.checkpoint.sqlite import SQLiteCheckpointer
from core.recovery import ThreadState, diagnose

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to give the app a real terminal")


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=False).stdout


def _wait_for_screen(socket: str, text: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux(socket, "capture-pane", "-p", "-t", "app")
        if text in screen:
            return screen
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {text!r} on the screen:\n{screen}")


def _ended(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie nobody reaped: its parent was tmux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


_BLOCK_SIGHUP_THEN_EXEC = (
    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP]); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""Starts the app with SIGHUP blocked (a blocked signal stays blocked across exec), so the
app learns of the closed terminal only by watching it. Before, such an app stayed alive
for good, spinning, and even SIGTERM no longer ended it."""


@pytest.mark.parametrize("sighup", [True, False], ids=["sighup", "sighup-never-arrives"])
def test_closing_the_terminal_during_a_run_aborts_it_and_ends_the_process(tmp_path: Path, sighup: bool) -> None:
    db = tmp_path / "threads.sqlite"
    socket = f"cubepi-hangup-{os.getpid()}"
    launcher = "" if sighup else f"-c {shlex.quote(_BLOCK_SIGHUP_THEN_EXEC)}"
    command = f"exec env XDG_DATA_HOME={tmp_path / 'data'} {sys.executable} {launcher} -m tui.cli --demo --demo-speed 0.5 {db}"
    subprocess.run(
        ["tmux", "-L", socket, "new-session", "-d", "-s", "app", "-x", "120", "-y", "40", command], check=True
    )
    try:
        _wait_for_screen(socket, "New thread")  # the picker is drawn (at 80 columns "? Help" no longer fits its footer)
        _tmux(socket, "send-keys", "-t", "app", "n")
        time.sleep(0.5)
        _tmux(socket, "send-keys", "-t", "app", "-l", "train a model")
        _tmux(socket, "send-keys", "-t", "app", "Enter")
        _wait_for_screen(socket, "running")
        pid = int(_tmux(socket, "display-message", "-p", "-t", "app", "#{pane_pid}").strip())
    finally:
        _tmux(socket, "kill-server")  # the hang-up
    deadline = time.monotonic() + 25.0  # under the 30 s watchdog: the orderly path ended it
    while not _ended(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # leave no orphan spinning behind a failed test
            raise AssertionError(f"the app (pid {pid}) was still alive 25 s after its terminal closed")
        time.sleep(0.1)

    async def state() -> tuple[ThreadState, object]:
        store = await SQLiteCheckpointer.open(db, create=False)
        try:
            (summary,) = await store.list_threads()
            data = await store.load(summary.thread_id)
            assert data is not None
            return diagnose(data.messages, data.runs).state, summary.lease
        finally:
            await store.close()

    thread_state, lease = asyncio.run(state())
    assert thread_state is ThreadState.ABORTED
    assert lease is None
