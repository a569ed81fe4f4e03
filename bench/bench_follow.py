"""Benchmark: what following a long thread costs per persisted message.

Run: ``.venv/bin/python -m bench.bench_follow [--messages 10000] [--appends 50]``

A SQLite file holds one thread of ``--messages`` messages (the realistic mix of
``bench_store``). Two :class:`~core.follow.ThreadFollower` objects follow it, each on its
own connection: one as the app runs it (reads only the rows after the last one it has,
``load_after``), and one on a store that does not declare ``IncrementalReads``, so every persisted message
makes it load and decode the whole thread again (what the follower did before, and what
any follower without incremental reads does). A writer on a third connection appends
``--appends`` messages one at a time; after each, both followers refresh and the time of
each refresh is recorded. The decode holds the GIL, so this time is also time the app's
event loop cannot answer a key press (DESIGN.md: key presses within 50 ms). Not a test:
it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_store import make_messages
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.follow import ThreadFollower

KEY_PRESS_MS = 50.0
"""DESIGN.md's bound on answering a key press; a refresh longer than this can delay one."""


class WholeReloads:
    """The store behind a wrapper that declares no capability: the follower, seeing no
    ``IncrementalReads`` (``core.checkpoint.capabilities.supports``), loads it whole."""

    def __init__(self, store: SQLiteCheckpointer) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def main(n_messages: int, n_appends: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "follow.sqlite"
        writer = await SQLiteCheckpointer.open(path)
        history = make_messages(n_messages)
        for start in range(0, n_messages, 500):
            await writer.append("t", history[start : start + 500])
        extra = make_messages(n_appends)

        stores = {"incremental": await SQLiteCheckpointer.open(path), "whole reload": None}
        stores["whole reload"] = WholeReloads(await SQLiteCheckpointer.open(path))  # type: ignore[assignment]
        followers = {name: ThreadFollower(store, "t", reload_interval=0) for name, store in stores.items()}
        first: dict[str, float] = {}
        for name, follower in followers.items():
            t0 = time.perf_counter()
            await follower.refresh(force=True)
            first[name] = (time.perf_counter() - t0) * 1000

        costs: dict[str, list[float]] = {name: [] for name in followers}
        for message in extra:
            await writer.append("t", [message])
            for name, follower in followers.items():
                t0 = time.perf_counter()
                change = await follower.refresh()
                costs[name].append((time.perf_counter() - t0) * 1000)
                assert change is not None and len(change.added) == 1, name

        total = n_messages + n_appends
        for name, follower in followers.items():
            assert len(follower.model.messages) == total, name
        print(
            f"one thread of {n_messages:,} messages; {n_appends} messages appended one at a time by another connection\n"
        )
        print(f"{'':44}{'incremental':>12}{'whole reload':>14}{'ratio':>8}")
        rows = [
            ("first load (attach), ms", first["incremental"], first["whole reload"]),
            (
                "refresh per persisted message, median ms",
                statistics.median(costs["incremental"]),
                statistics.median(costs["whole reload"]),
            ),
            ("refresh per persisted message, p95 ms", _p95(costs["incremental"]), _p95(costs["whole reload"])),
            ("refresh per persisted message, max ms", max(costs["incremental"]), max(costs["whole reload"])),
        ]
        for label, ours, whole in rows:
            print(f"{label:44}{ours:12.2f}{whole:14.2f}{whole / ours:7.1f}x")
        slow = {name: sum(c > KEY_PRESS_MS for c in cs) for name, cs in costs.items()}
        print(
            f"\nrefreshes longer than {KEY_PRESS_MS:g} ms (a key press could wait):"
            f" incremental {slow['incremental']}/{n_appends}, whole reload {slow['whole reload']}/{n_appends}"
        )
        for store in stores.values():
            await getattr(store, "_store", store).close()
        await writer.close()


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else values[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.messages, args.appends))
