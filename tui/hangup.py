"""Ending cleanly when the terminal goes away (SIGHUP: the window closed, ssh dropped).

A hung-up terminal fails every write with EIO and reads as end-of-file forever. Textual's
output thread dies on the first failed write, after which its bounded queue fills and the
app's own shutdown (which writes to restore the terminal) blocks for good, while its input
thread spins on end-of-file: measured here as an orphan process at 100% CPU that SIGTERM
no longer ends. So on SIGHUP the app points its standard streams at ``/dev/null`` (writes
then succeed and go nowhere), ends the way quitting does (runs aborted and saved), and a
watchdog ends the process outright if that shutdown still hangs.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Callable

WATCHDOG_SECONDS = 30.0
"""How long the shutdown after a hang-up may take before the process is ended outright:
enough for runs to be aborted and saved (tools get 5 s of grace by default)."""

EXIT_CODE = 128 + signal.SIGHUP
"""The shell convention for "ended by signal N" (129 for SIGHUP)."""


def detach_from_terminal() -> None:
    """Point file descriptors 0, 1 and 2 at ``/dev/null``. Raises ``OSError`` if it cannot."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    finally:
        os.close(null)


def start_watchdog(seconds: float = WATCHDOG_SECONDS, code: int = EXIT_CODE) -> threading.Thread:
    """End the process with ``code`` after ``seconds`` unless it ended before (a daemon thread)."""

    def end() -> None:
        os._exit(code)  # only reached when the orderly shutdown hung

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()
    return timer


def drain_output(driver: object) -> None:
    """Keep Textual's output queue moving once its writer thread is gone.

    The writer may already have died on the dead terminal before the signal handler ran
    (or die on a write it had begun): nothing would empty its bounded queue again, and the
    app's next writes would block it for good. A daemon thread waits for the writer to end
    and from then on discards what is queued. Uses Textual 8's private ``_writer_thread``
    and its ``_queue``; does nothing when they are not there.
    """
    writer = getattr(driver, "_writer_thread", None)
    queue = getattr(writer, "_queue", None)
    if not isinstance(writer, threading.Thread) or queue is None:
        return

    def discard() -> None:
        writer.join()
        while True:
            queue.get()

    threading.Thread(target=discard, daemon=True, name="hangup-drain").start()


def on_hangup(callback: Callable[[], None], driver: Callable[[], object] = lambda: None) -> Callable[[], None]:
    """Call ``callback`` (from the main thread, as a signal handler) after detaching from the
    terminal, keeping ``driver()``'s output moving (:func:`drain_output`) and starting the
    watchdog, when SIGHUP arrives. Returns the function that puts the previous handler
    back. A plain ``signal.signal`` handler, not the event loop's: it must run even when
    the loop is stuck writing to the dead terminal. Raises ``ValueError`` when called from
    another thread than the main one."""

    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            detach_from_terminal()
        except OSError:
            pass  # still end, the watchdog covers a hang
        drain_output(driver())
        start_watchdog()
        callback()

    previous = signal.signal(signal.SIGHUP, handler)

    def restore() -> None:
        signal.signal(signal.SIGHUP, previous)

    return restore
