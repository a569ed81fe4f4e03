"""``kill`` ends the app even when its event loop is stuck, and a closed terminal is noticed
even when SIGHUP never arrives (real processes, a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tui.hangup import watch_terminal

_STUCK_CHILD = """
import queue, sys, pathlib
from tui.hangup import on_termination
marker = pathlib.Path(sys.argv[1])
on_termination(lambda signum: marker.write_text(str(signum)), watchdog_seconds=1.0)
stuck = queue.Queue(maxsize=1)
stuck.put("full")
print("stuck", flush=True)
stuck.put("blocks for good")  # like Textual's output queue behind a terminal that stopped reading
"""


def test_sigterm_ends_a_process_whose_main_thread_is_blocked(tmp_path: Path) -> None:
    marker = tmp_path / "told"
    child = subprocess.Popen([sys.executable, "-c", _STUCK_CHILD, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "stuck"
        child.send_signal(signal.SIGTERM)
        code = child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert marker.read_text() == str(int(signal.SIGTERM))  # the orderly end was asked for...
    assert code == 128 + signal.SIGTERM  # ...and the watchdog ended it when it could not run


def test_a_hung_up_terminal_is_noticed_without_sighup() -> None:
    master, slave = pty.openpty()
    seen = threading.Event()
    stop = watch_terminal(slave, seen.set, interval=0.1)
    try:
        time.sleep(0.3)
        assert not seen.is_set(), "a live terminal was taken for a hung-up one"
        os.close(master)  # the terminal window closes
        assert seen.wait(10), "the hang-up was not noticed"
    finally:
        stop.set()
        os.close(slave)
