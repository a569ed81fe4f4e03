"""Child processes that print ``MARK <name>`` lines and are SIGKILLed at a known mark."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory for ``python -m tests.…`` children."""

CHILD_TIMEOUT = 60.0
"""Seconds a child may take to reach its mark or its end (a liveness bound, not a speed check)."""


class ChildFailed(RuntimeError):
    """A child did not end the way its caller said it would (the message has its stderr)."""


def run_marked(
    argv: Sequence[str],
    what: str,
    *,
    kill_at: Sequence[str] = (),
    timeout: float = CHILD_TIMEOUT,
    cwd: str | None = None,
) -> list[str]:
    """Run ``argv``; return the marks it printed on stdout (``MARK <name>`` lines, flushed).

    With ``kill_at`` (mark names) the child is SIGKILLed as soon as every one of them was
    printed, and must die of that signal; without, it must exit 0 after ``MARK done``.
    Raises :class:`ChildFailed` (naming ``what``) when the child ends otherwise, or is still
    short of its marks after ``timeout`` seconds (it is then killed).
    """
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    marks: list[str] = []
    wanted = set(kill_at)
    killed = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("MARK "):
                marks.append(line[5:].strip())
            if wanted and wanted <= set(marks):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
        proc.wait()
    finally:
        timer.cancel()
        stderr = proc.stderr.read() if proc.stderr else ""
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    if kill_at:
        if not killed or proc.returncode != -signal.SIGKILL:
            raise ChildFailed(
                f"{what} ended {proc.returncode} before its marks {sorted(wanted)} (got {marks}): {stderr[-2000:]}"
            )
    elif proc.returncode != 0 or "done" not in marks:
        raise ChildFailed(f"{what} ended {proc.returncode} (marks {marks}): {stderr[-2000:]}")
    return marks


def signal_unreaped(proc: asyncio.subprocess.Process, sig: int) -> None:
    """Send ``sig`` to an asyncio child by pid, unless it is known to have ended already.

    ``asyncio.subprocess.Process.send_signal`` (and ``kill``, ``terminate``) on Python before
    3.13 go through ``subprocess.Popen.send_signal``, which first polls the child with
    ``waitpid``; when the child has just exited, that poll reaps it under the event loop's
    child watcher, and the watcher then reports return code 255 ("Unknown child process
    pid") in place of the real one (CPython gh-87744, fixed in 3.13 by signalling by pid).
    ``os.kill`` never reaps: a child that ended first stays a zombie until the watcher
    reaps it, so its real return code is kept and its pid cannot be reused meanwhile.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
