"""The runner child of the README scenes (``tests/helpers/scenes.py``): one headless run, held
still for the picture.

Usage: ``python -m tests.helpers.scene_runner DB THREAD PROMPT`` (from the repository root).
Runs ``THREAD`` of the SQLite file ``DB`` (unowned, upgrading cubeloop's file if needed) with
``PROMPT`` through ``core.runner.run_headless`` and the agent ``scenes.paused_demo_agent``
(its tools stop at a known step until aborted), its clock held at ``frozen_clock.CLOCK``
and its lease naming host ``scenes.RUNNER_HOST`` and pid ``scenes.RUNNER_PID``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from core.leases import LeaseHolder
from core.owners import UNOWNED
from core.runner import run_headless
from tests.helpers.frozen_clock import CLOCK
from tests.helpers.scenes import RUNNER_HOST, RUNNER_PID, paused_demo_agent

if __name__ == "__main__":
    db, thread, prompt = sys.argv[1:4]
    time.time = lambda: CLOCK  # type: ignore[assignment]  # see tests/helpers/frozen_clock.py
    sys.exit(
        asyncio.run(
            run_headless(
                db,
                thread,
                prompt,
                owner=UNOWNED,
                agent=paused_demo_agent,
                upgrade=True,
                holder=LeaseHolder(pid=RUNNER_PID, host=RUNNER_HOST),
                handle_signals=True,
            )
        )
    )
