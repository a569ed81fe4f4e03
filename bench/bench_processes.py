"""Benchmark: how long from a run's abort to the result of a tool's child process group.

Run: ``.venv/bin/python -m bench.bench_processes [--runs 20]``

Each run starts a real child (a Python script that starts a grandchild in its group and
sleeps) through :func:`core.processes.run_process`; the abort signal is set when the child
prints its first line, and the clock stops when ``run_process`` returns (both processes
ended, the output read). The target is that of ``bench_abort``: 100 ms. A second series
measures a child that ignores SIGTERM: its latency is the term grace plus the overhead.
Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from core.processes import run_process
from core.tools import ToolContext

_CHILD = (
    "import signal, subprocess, sys, time\n"
    "if sys.argv[1] == 'stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


async def one_run(mode: str, grace: float) -> float:
    """Seconds from the abort to ``run_process`` returning, for one child."""
    signal = asyncio.Event()
    aborted_at = 0.0

    def on_line(line: str) -> None:
        nonlocal aborted_at
        aborted_at = time.perf_counter()
        signal.set()

    ctx = ToolContext("bench", signal, lambda progress, text: None, None, 2 * grace)
    await run_process(ctx, [sys.executable, "-c", _CHILD, mode], on_line=on_line)
    return time.perf_counter() - aborted_at


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--grace", type=float, default=0.2, help="term grace in seconds (default 0.2)")
    args = parser.parse_args()
    for mode in ("polite", "stubborn"):
        times = sorted([await one_run(mode, args.grace) * 1000 for _ in range(args.runs)])
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
        print(
            f"{mode:9} child + grandchild: abort -> result median {statistics.median(times):.1f} ms, "
            f"p95 {p95:.1f} ms, max {times[-1]:.1f} ms ({args.runs} runs)"
        )


if __name__ == "__main__":
    asyncio.run(main())
