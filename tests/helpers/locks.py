"""A real second process holding a SQLite write lock (``BEGIN IMMEDIATE``) for a while."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HOLDER = """
import json, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
for sql, params in json.loads(sys.argv[4]):
    db.execute(sql, params)
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))
db.execute("COMMIT")
db.close()
"""


class LockHolder:
    """A child process that takes the write lock of ``path``, holds it ``seconds``, then commits.

    ``statements`` (``(sql, params)`` pairs) are executed inside that transaction right
    after the lock is taken, so they become visible when it commits (e.g. a takeover).

    ``start()`` returns once the lock is held (a marker file appears); ``wait()`` once the
    process ended (the lock released). Raises ``AssertionError`` when either takes longer
    than ``timeout`` seconds more than expected (a liveness bound).
    """

    def __init__(
        self,
        path: Path,
        seconds: float,
        timeout: float = 60.0,
        statements: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> None:
        self.path = path
        self.statements = [[sql, list(params)] for sql, params in statements]
        self.seconds = seconds
        self.timeout = timeout
        self.marker = path.with_name(path.name + ".locked")
        self.proc: subprocess.Popen[bytes] | None = None
        self.held_at = 0.0

    def start(self) -> LockHolder:
        argv = [
            sys.executable,
            "-c",
            _HOLDER,
            str(self.path),
            str(self.marker),
            str(self.seconds),
            json.dumps(self.statements),
        ]
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + self.timeout
        while not self.marker.exists():
            assert self.proc.poll() is None, f"the lock holder exited ({self.proc.returncode}) before locking"
            assert time.monotonic() < deadline, "the lock holder never took the lock"
            time.sleep(0.02)
        self.held_at = time.monotonic()
        return self

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=self.seconds + self.timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=self.timeout)
