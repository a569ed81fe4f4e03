"""A fork server for the crash-injection test: imports everything once, then forks children.

Starting a fresh interpreter that imports pydantic, aiosqlite and ``core`` costs ~0.25 s of
CPU (the server backends and their drivers, asyncpg and redis, are imported too, when installed); forking this warmed-up process costs a millisecond, so hundreds of real child
processes fit in the test's time budget.

Protocol (JSON lines): the parent writes a request ``{"id": n, ...}`` to stdin; this
process forks a child that runs :func:`tests.crash.scenario.child_main` on it and answers
``{"id": n, "pid": pid}``. When a child dies it answers ``{"exit": pid, "signal": s,
"code": c}``. Children never exit on their own (after their run they sleep until
killed), so a pid the parent holds is never reused under it. At EOF on stdin every child
still alive is killed (by pid) and reaped, then this process exits. Children die with
this process and this process with its parent (``PR_SET_PDEATHSIG``).

Usage: python -m tests.crash.forkserver
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import select
import signal
import sys
import time
import traceback

from tests.crash import scenario  # the warm imports every child shares
from tests.helpers.store_locations import preload_backends

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _send(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _child(req: dict) -> None:
    """Runs in the forked child; never returns."""
    try:
        _die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        try:
            asyncio.run(scenario.child_main(req))
        except BaseException:
            text = traceback.format_exc()
            sys.stderr.write(text)
            fd = os.open(req["notes"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, (json.dumps({"error": text}) + "\n").encode())
        while True:  # wait for the parent's SIGKILL
            time.sleep(3600)
    finally:
        os._exit(70)


def main() -> None:
    _die_with_parent()
    preload_backends()
    children: set[int] = set()
    buffer = b""
    _send({"ready": os.getpid()})
    while True:
        readable, _, _ = select.select([0], [], [], 0.005 if children else 0.5)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children.add(pid)
                _send({"id": req["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send(
                {
                    "exit": pid,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                }
            )
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass


if __name__ == "__main__":
    main()
