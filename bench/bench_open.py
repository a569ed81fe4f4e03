"""Benchmark: open a long thread from the picker; time to its last message painted, RSS after.

Run: ``.venv/bin/python -m bench.bench_open [--messages 10000 100000] [--repeat 5]``

A SQLite file holds one thread of ``--messages`` messages (the realistic mix of
``bench_store``). Each measurement is a fresh process (RSS is a process's): the real app
runs headless (``App.run_test``, 120x40), its picker lists the thread, Enter opens it, and
the time is taken until the newest message is on screen, then until the thread is loaded
(its whole-thread diagnosis and totals shown). RSS (``VmRSS``) is read once it is loaded,
and the peak (``VmHWM``). Issue 10's targets: open a 10,000-message thread in <= 300 ms,
RSS <= 250 MB with a 100,000-message thread open. Prints medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_store import make_messages

THREAD = "bench"


def _status(field: str) -> float:
    """A ``/proc/self/status`` size in MB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _fill(path: Path, n: int) -> None:
    from core.checkpoint.sqlite import SQLiteCheckpointer

    store = await SQLiteCheckpointer.open(path, create=True)
    try:
        messages = make_messages(n)
        for i in range(0, n, 5000):
            await store.append(THREAD, messages[i : i + 5000])
    finally:
        await store.close()


async def _open_once(path: Path, n: int) -> dict[str, float]:
    """One open in this process (the child's side)."""
    from tui.app import make_app
    from tui.cli import build_session
    from tui.screens.thread import ThreadScreen

    def screen_text(app: object) -> str:
        return "\n".join(strip.text for strip in app.screen._compositor.render_strips())  # type: ignore[attr-defined]

    last = f"Step {n - 1 - (n - 1) % 3}:"  # make_messages: every third message is a prompt
    app = make_app(build_session(path, demo=True))
    async with app.run_test(size=(120, 40)) as pilot:
        while THREAD not in screen_text(app):
            await pilot.pause(0.02)
        await pilot.pause(0.3)
        started = time.perf_counter()
        await pilot.press("enter")
        while last not in screen_text(app):
            await pilot.pause(0.005)
        painted = time.perf_counter() - started
        while not (isinstance(app.screen, ThreadScreen) and app.screen.loaded):
            await pilot.pause(0.01)
        loaded = time.perf_counter() - started
        await pilot.pause(0.5)
        return {"painted": painted, "loaded": loaded, "rss": _status("VmRSS"), "peak": _status("VmHWM")}


def main(sizes: list[int], repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"t{n}.sqlite"
            asyncio.run(_fill(path, n))
            runs = []
            for _ in range(repeat):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.bench_open", "--child", str(path), str(n)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(
                f"open {n:>7,} messages: last message painted {med['painted'] * 1000:6.0f} ms"
                f" (min {min(r['painted'] for r in runs) * 1000:.0f}), loaded {med['loaded'] * 1000:6.0f} ms,"
                f" RSS {med['rss']:5.0f} MB (peak {med['peak']:.0f}); median of {repeat}"
            )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(asyncio.run(_open_once(Path(sys.argv[2]), int(sys.argv[3])))))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    main(args.messages, args.repeat)
