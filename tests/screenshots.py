"""Regenerate the README screenshots: ``python -m tests.screenshots [NAME ...]`` (not collected
by pytest); without names, all of them.

Each screenshot is a scene of ``tests/helpers/scenes.py`` (the real app, ``make_app``,
driven headlessly on a store written the way its programs write it; cubeloop's threads by
the real cubeloop), the same scene ``tests/tui/test_snapshots.py`` compares with its
accepted snapshot, played in its own directory under the system's temporary directory with
the zone pinned to UTC. It saves ``screenshots/NAME.svg`` for:

* ``crash``: the crash banner of a cubeloop thread that crashed mid-tool;
* ``waiting``: a cubeloop thread whose run asked a human question (HITL);
* ``answer``: the answer dialog of a cubeloop approval (``delete_file`` stopped by its
  approval policy), deny chosen and a reason typed;
* ``thread``: a new demo thread on cubeloop's file (upgraded first), its tools reporting
  progress;
* ``picker``: the thread list, one thread "running here", one run by a headless runner
  child (``tests.helpers.scene_runner``) on host ``build-7``, one crashed on ``build-3``;
* ``elsewhere``: the thread the child process runs, followed live, with a steer sent to
  it (the commands bar lists it pending: editable until the run's next turn boundary);
* ``resume``: the resume confirmation of a thread killed with three tool calls in flight
  (one re-run, one reused, one to choose for);
* ``owners``: at 80x24, the thread list of owner ``alice`` ("threads of alice · 3") on a
  store that also holds bob's and unowned threads;
* ``changes``: at 80x24, the dialog a new prompt on that thread shows (what changed; ``a``
  accepts, Escape cancels);
* ``owner-line``: at 80x24, one of alice's threads whose workflow version changed from 1 to
  2 and was accepted: the owner line with the override recorded.

cubeloop's threads record no owner, so the first six are taken in the unowned scope, as a
user opening a cubeloop database sees them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.cubeloop_threads import make_crashpoint_db
from tests.helpers.scenes import SCENES, Scene, staged

OUT = Path(__file__).resolve().parent.parent / "screenshots"


async def _shoot(scene: Scene, work: Path, crashpoints: Path) -> None:
    """Play ``scene`` in ``work`` and save ``OUT/NAME.svg`` at the moment it shows."""
    with staged(work, crashpoints) as stage:
        app = await scene.app(stage)
        async with app.run_test(size=scene.size) as pilot:
            await scene.drive(pilot, stage)
            app.save_screenshot(f"{scene.name}.svg", str(OUT))
            await app.session.stop_runs()


async def main(names: list[str]) -> None:
    """Write the SVGs of ``names`` (every scene when empty) into ``screenshots/``."""
    unknown = [n for n in names if n not in SCENES]
    if unknown:
        raise SystemExit(f"no such scene: {', '.join(unknown)} (scenes: {', '.join(SCENES)})")
    os.environ["TZ"] = "UTC"
    time.tzset()
    OUT.mkdir(exist_ok=True)
    work = Path(tempfile.gettempdir()) / "cubepi-tui-screenshots"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        crashpoints = work / "cubeloop_crashpoints.sqlite"
        make_crashpoint_db(crashpoints)  # written by the real cubeloop, as the tests do
        for name in names or list(SCENES):
            await _shoot(SCENES[name], work / name, crashpoints)
            print(f"wrote {OUT / name}.svg")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
