"""Benchmark: how fast a delta streamed in a runner process shows in a follower elsewhere,
and what the live-event log costs the database.

Run: ``.venv/bin/python -m bench.bench_live [--seconds 5] [--fast 5000] [--slow 50]``

A child process runs an :class:`~core.agent.Agent` under a :class:`~core.supervisor.Supervisor`
on a SQLite file; its provider streams one token (~4 characters) per delta at a fixed
rate, and every 100th token (every 5th at the slow rate) is a timestamp taken when the
provider yields it. This process follows the thread with a
:class:`~core.follow.ThreadFollower` (file watch + change token) and, when a timestamp
first appears in the follower's model, records now minus that timestamp: the whole path
delta -> agent -> live-event batch -> commit -> file watch -> read -> fold -> model.
Both processes share this machine's clock.

Write rate: the child counts the live-event batches (one transaction each) and rows it
wrote while streaming; "one row per delta" is what writing every delta would cost. Not a
test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 150.0
MARK = re.compile(r"⟦(\d+\.\d+)⟧")


# --- the child: a runner streaming at a fixed rate -------------------------------------------


class PacedProvider:
    """Streams ``rate`` tokens per second for ``seconds``, stamping every ``every``-th token."""

    name = "paced"
    model = "paced-1"

    def __init__(self, rate: float, seconds: float, every: int) -> None:
        self.rate, self.seconds, self.every = rate, seconds, every

    async def stream(self, request, signal) -> AsyncIterator:  # type: ignore[no-untyped-def]
        from core.events import StreamEnd, TextDelta
        from core.messages import AssistantMessage, TextContent

        parts: list[str] = []
        total = int(self.rate * self.seconds)
        start = time.perf_counter()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * self.rate) + 1)
            while sent < due:
                token = f"⟦{time.time():.6f}⟧" if sent % self.every == 0 else f"w{sent % 97:02d} "
                parts.append(token)
                sent += 1
                yield TextDelta(0, token)
            await asyncio.sleep(0.001)
        yield StreamEnd(
            AssistantMessage(content=[TextContent(text="".join(parts))], provider_id=self.name, model_id=self.model)
        )


async def child(db: str, thread: str, rate: float, seconds: float, every: int) -> None:
    from core.agent import Agent
    from core.checkpoint.sqlite import SQLiteCheckpointer
    from core.supervisor import Supervisor

    async with await SQLiteCheckpointer.open(db, create=False) as store:
        sup = Supervisor(Agent(PacedProvider(rate, seconds, every), store, thread))
        started = time.perf_counter()
        outcome = await sup.prompt("Stream.")
        elapsed = time.perf_counter() - started
        live = sup.live
        assert live is not None
        print(
            json.dumps(
                {
                    "outcome": outcome,
                    "seconds": elapsed,
                    "batches": live.batches,
                    "rows": live.rows,
                    "failures": live.failures,
                    "deltas": int(rate * seconds),
                }
            ),
            flush=True,
        )


# --- the parent: follow and measure ----------------------------------------------------------


async def measure(db: Path, thread: str, rate: float, seconds: float, every: int) -> dict[str, float]:
    from core.checkpoint.sqlite import SQLiteCheckpointer
    from core.follow import ThreadChange, ThreadFollower

    latencies: list[float] = []
    seen: set[str] = set()

    def on_change(change: ThreadChange) -> None:
        now = time.time()
        texts = [d.text for d in change.deltas]
        if change.partial_reset and change.model.partial is not None:
            texts.append(change.model.partial.text)
        for text in texts:
            for stamp in MARK.findall(text):
                if stamp not in seen:
                    seen.add(stamp)
                    latencies.append((now - float(stamp)) * 1000)

    async with await SQLiteCheckpointer.open(db, create=False) as store:
        follower = ThreadFollower(store, thread)
        follower.subscribe(on_change)
        async with follower:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.bench_live",
                "--child",
                str(db),
                thread,
                str(rate),
                str(seconds),
                str(every),
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )
            out, _ = await proc.communicate()
            await asyncio.sleep(0.3)
    report = json.loads(out.decode().strip().splitlines()[-1])
    latencies.sort()
    stream_seconds = report["seconds"]  # the run as the child timed it: the stream plus a few ms around it
    return {
        "rate": rate,
        "achieved": report["deltas"] / stream_seconds,
        "samples": len(latencies),
        "median": statistics.median(latencies) if latencies else float("nan"),
        "p95": latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan"),
        "max": latencies[-1] if latencies else float("nan"),
        "txn_s": report["batches"] / stream_seconds,
        "rows_s": report["rows"] / stream_seconds,
        "naive_rows_s": report["deltas"] / stream_seconds,
        "failures": report["failures"],
    }


async def main(seconds: float, fast: float, slow: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        from core.checkpoint.sqlite import SQLiteCheckpointer

        db = Path(tmp) / "live.sqlite"
        await (await SQLiteCheckpointer.open(db, create=True)).close()
        rows = [
            (f"fast stream ({fast:,.0f} tokens/s)", await measure(db, "fast", fast, seconds, 100)),
            (f"model pace ({slow:,.0f} tokens/s)", await measure(db, "slow", slow, seconds, 5)),
        ]
    print(
        f"Delta in a runner process -> follower's model in this one (SQLite file, watch step 10 ms, batches every 50 ms);"
        f" {seconds:g} s per stream\n"
    )
    print(
        f"{'':30}{'tokens/s':>9}{'samples':>8}{'median ms':>11}{'p95 ms':>8}{'max ms':>8}{'p95/target':>12}"
        f"{'txn/s':>8}{'rows/s':>8}{'1 row/delta':>13}"
    )
    for label, r in rows:
        print(
            f"{label:30}{r['achieved']:>9,.0f}{r['samples']:>8}{r['median']:>11.0f}{r['p95']:>8.0f}{r['max']:>8.0f}"
            f"{r['p95'] / TARGET_MS:>11.2f}x{r['txn_s']:>8.1f}{r['rows_s']:>8.1f}{r['naive_rows_s']:>13,.0f}"
        )
    print(
        f"\nTarget: p95 under {TARGET_MS:.0f} ms (ratio below 1.00 meets it). Rows are live events after joining consecutive"
        " deltas of a block; '1 row/delta' is the rate without batching (and as many transactions)."
    )
    if any(r["failures"] for _, r in rows):
        print("Some live-event batches could not be written (see the child's log).")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        db_path, thread_id, rate_s, seconds_s, every_s = sys.argv[2:7]
        asyncio.run(child(db_path, thread_id, float(rate_s), float(seconds_s), int(every_s)))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each stream lasts (default 5)")
    parser.add_argument(
        "--fast", type=float, default=5000.0, help="tokens per second of the fast stream (default 5000)"
    )
    parser.add_argument(
        "--slow", type=float, default=50.0, help="tokens per second of the model-paced stream (default 50)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.fast, args.slow))
