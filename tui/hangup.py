"""Ending cleanly when the terminal goes away (the window closed, ssh dropped) or a signal
(``kill``) asks the app to end.

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
import select
import signal
import threading
from collections.abc import Callable
from types import FrameType

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


def watch_terminal(fd: int, on_hangup: Callable[[], None], interval: float = 0.5) -> threading.Event:
    """Call ``on_hangup()`` (from a daemon thread) once the terminal on ``fd`` hangs up.

    Catches a closed terminal whose SIGHUP never arrives (the app started with SIGHUP
    blocked, or under a parent that keeps it), measured here as a process left at 30% CPU
    that only SIGKILL ended. ``poll`` reports POLLHUP for a hung-up terminal and nothing
    for a live one, without reading (Textual's input thread keeps every key). Checks
    every ``interval`` seconds; set the returned event to stop watching.
    """
    stop = threading.Event()

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: only POLLHUP/POLLERR/POLLNVAL come back
        while not stop.is_set():
            if poller.poll(interval * 1000):
                if not stop.is_set():
                    on_hangup()
                return

    threading.Thread(target=watch, daemon=True, name="hangup-watch").start()
    return stop


def on_hangup(callback: Callable[[], None], driver: Callable[[], object] = lambda: None) -> Callable[[], None]:
    """Call ``callback`` once the terminal goes away: on SIGHUP, or when the terminal on
    standard input is seen hung up (:func:`watch_terminal`), whichever comes first.

    Before ``callback`` the process detaches from the terminal, keeps ``driver()``'s output
    moving (:func:`drain_output`) and starts the watchdog. ``callback`` may run in a signal
    handler or another thread: it must be thread-safe (``loop.call_soon_threadsafe``).
    SIGHUP gets a plain ``signal.signal`` handler, not the event loop's: it must run even
    when the loop is stuck writing to the dead terminal. Returns the function that stops
    watching and puts the previous handler back. Raises ``ValueError`` when called from
    another thread than the main one.
    """
    once = threading.Lock()

    def hung_up() -> None:
        if not once.acquire(blocking=False):
            return  # the signal and the watcher both saw it
        try:
            detach_from_terminal()
        except OSError:
            pass  # still end, the watchdog covers a hang
        drain_output(driver())
        start_watchdog()
        callback()

    previous = signal.signal(signal.SIGHUP, lambda signum, frame: hung_up())
    stop = watch_terminal(0, hung_up) if os.isatty(0) else None

    def restore() -> None:
        if stop is not None:
            stop.set()
        signal.signal(signal.SIGHUP, previous)

    return restore


def on_termination(
    callback: Callable[[int], None],
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
    *,
    watchdog: bool = True,
    watchdog_seconds: float = WATCHDOG_SECONDS,
) -> Callable[[], None]:
    """Call ``callback(signum)`` when one of ``signals`` arrives, after starting the
    watchdog (exit status ``128 + signum``) unless ``watchdog`` is false (an app under
    test must not end the test process).

    A plain ``signal.signal`` handler, so it runs even while the event loop is blocked
    (on a terminal that stopped reading, Textual's output queue fills and the loop waits
    on it: the loop's own signal handlers then never ran and ``kill`` did nothing); the
    watchdog ends the process if the orderly end cannot. ``callback`` must be thread-safe.
    Returns the function that puts the previous handlers back. Raises ``ValueError`` when
    called from another thread than the main one.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        if watchdog:
            start_watchdog(watchdog_seconds, code=128 + signum)
        callback(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
