"""Every figure of issue 10's table, ours and the peers', in one run.

Run: ``.venv/bin/python -m bench [--quick] [--only NAME[,NAME]] [--sizes KEY=N[,KEY=N]]``

One line per figure: median, p95 (nearest rank; with 20 samples or fewer it is the
largest), the sample count, the target, whether it is met (the p95 where one is shown,
else the median) and, where a peer does the same work, its median and ours/peer. Peers
(cubeloop, LangGraph) need the ``bench`` extra; a missing one prints one line saying how to
install it. Each SQLite side's durability (journal mode, ``synchronous``) is read from its
connection and printed, and writes are compared at equal durability too.

Groups (``--only``): ``stream`` (keys while a reply streams at 5,000 tok/s, run in the app
and in another process), ``idle`` (keys on an idle app), ``list``, ``start`` (start to the
picker of N threads, keys there), ``load``, ``open`` (open an N-message thread from the
picker, keys there, RSS), ``rss`` (the app with a 100,000-message thread open), and the
runtime figures ahead of the peers: ``append``,
``loop``, ``turns``. App figures run the real app in a pseudo-terminal
(:mod:`bench.app_figures`). Nothing here asserts: it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench import app_figures, loop_figures, store_figures
from bench.fill import fill_long_thread, fill_threads, thread_id
from bench.peers import absent, missing, our_durability
from bench.report import HEADER, Figure, line
from core.words import counted


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much of everything; the defaults are the issue's table (``--quick``: :data:`QUICK`)."""

    threads: int = 10_000
    """Threads in the listing and start figures."""
    per_thread: int = 10
    """Messages of each of those threads."""
    messages: int = 10_000
    """Messages of the thread loaded and opened."""
    big: int = 100_000
    """Messages of the thread open for the RSS figure."""
    seconds: float = 30.0
    """Seconds one streamed reply lasts (keys are timed near 2 s and near ``seconds - 5``)."""
    rate: float = 5_000.0
    """Tokens per second of the streamed reply."""
    replies: int = 2
    """Streamed replies per path (more samples per window)."""
    key_pairs: int = 15
    """Help open/close pairs per idle figure (two samples each)."""
    app_runs: int = 3
    """App starts for the start, open and RSS figures."""
    repeat: int = 9
    """Calls per listing and load figure."""
    appends: int = 300
    """One-message appends per append figure (LangGraph's: a tenth, each a whole checkpoint)."""
    loop_calls: int = 200
    """Model calls per run of our loop figure (three runs)."""
    peer_calls: int = 5
    """Model calls of cubeloop's loop run (each costs it a pass over the history)."""
    turns: int = 200
    """Tool turns per run of ours (three runs)."""
    peer_turns: int = 60
    """Tool turns per run of cubeloop's."""


QUICK = Sizes(
    threads=200,
    per_thread=10,
    messages=400,
    big=2_000,
    seconds=6.0,
    replies=1,
    key_pairs=3,
    app_runs=1,
    repeat=3,
    appends=40,
    loop_calls=30,
    peer_calls=3,
    turns=20,
    peer_turns=10,
)
"""``--quick``: every figure at tiny sizes, in about a minute; the figures only show it runs."""

GROUPS = ("stream", "idle", "list", "start", "load", "open", "rss", "append", "loop", "turns")


def windows(seconds: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The two windows (start, end seconds into the reply) whose keys make the streaming
    figures: near 2 s, and near the reply's end less 5 s (25 s of a 30 s reply)."""
    if seconds >= 12:
        return (1.0, 4.0), (seconds - 8.0, seconds - 2.0)
    return (0.5, seconds / 2), (seconds / 2, seconds - 0.3)


def _mid(window: tuple[float, float]) -> str:
    return f"~{(window[0] + window[1]) / 2:.0f} s"


# --- the groups -------------------------------------------------------------------------------


def stream_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """Key presses while a reply streams, in the app and in another process, early and late."""
    here, elsewhere = app_figures.stream_threads(sizes.replies)
    store = directory / "stream.sqlite"
    for tid in (*here, *elsewhere):
        asyncio.run(fill_long_thread(store, 20, tid))
    early, late = windows(sizes.seconds)
    for ids, in_app in ((here, True), (elsewhere, False)):
        runs = [app_figures.stream_keys(store, tid, here=in_app, rate=sizes.rate, seconds=sizes.seconds) for tid in ids]
        where = runs[0].where
        written = sum(r.bytes_per_s for r in runs) / len(runs) / 1000
        reader = max(r.reader_share for r in runs) * 100
        for window in (early, late):
            yield Figure(
                "stream",
                f"key press, a reply streaming {where}, {_mid(window)} in (ms)",
                "ms",
                [ms for r in runs for ms in r.within(*window)],
                at_most=50,
                note=f"{sizes.rate:,.0f} tok/s for {sizes.seconds:g} s, keys pressed {window[0]:g}-{window[1]:g} s "
                f"into the reply, {counted(len(runs), 'reply', 'replies')}; the app wrote {written:,.0f} kB/s to the terminal (emulating its screen took {reader:.1f} % of a core)",
            )


def idle_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """Key presses on an idle app: the picker of a small store."""
    store = directory / "idle.sqlite"
    ids = asyncio.run(fill_threads(store, 20, 10))
    with app_figures.app_terminal(app_figures.app_argv(store)) as term:
        if term.wait_for(lambda s: ids[-1] in s, 120) is None:
            raise TimeoutError("The picker did not show within 120 s.")
        time.sleep(1.0)
        samples = app_figures.idle_keys(term, sizes.key_pairs * 2)
    yield Figure("idle", "key press, idle app (picker, 20 threads) (ms)", "ms", samples, at_most=50)


def _many_threads(sizes: Sizes, directory: Path) -> Path:
    """The store of ``sizes.threads`` threads of ``sizes.per_thread`` messages, but the newest
    of ``sizes.messages``: the listing must not grow with messages per thread."""
    path = directory / "threads.sqlite"
    if not path.exists():
        asyncio.run(fill_threads(path, sizes.threads - 1, sizes.per_thread))
        asyncio.run(fill_long_thread(path, sizes.messages, thread_id(sizes.threads - 1)))
    return path


def list_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """``list_threads`` on ``sizes.threads`` threads."""
    store = _many_threads(sizes, directory)
    samples = asyncio.run(store_figures.list_threads_ms(store, sizes.threads, sizes.repeat))
    note = absent("cubeloop") or "cubeloop 0.15.3 has no thread listing API (its store lists nothing)"
    yield Figure(
        "list",
        f"list_threads on {sizes.threads:,} threads (ms)",
        "ms",
        samples,
        at_most=200,
        peer_note=note,
        note=f"{sizes.threads - 1:,} threads of {sizes.per_thread} messages and one of {sizes.messages:,}",
    )


def start_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """Start to painted picker with ``sizes.threads`` threads, and keys on that picker."""
    store = _many_threads(sizes, directory)
    newest = thread_id(sizes.threads - 1)
    runs = [
        app_figures.open_run(store, threads=sizes.threads, newest=newest, key_pairs=sizes.key_pairs, open_thread=False)
        for _ in range(sizes.app_runs)
    ]
    n = f"{sizes.threads:,}"
    yield Figure(
        "start",
        f"app start to a painted picker, {n} threads (ms)",
        "ms",
        [r.start_ms for r in runs],
        1000,
        percentile=False,
        note="from starting the process until the screen shows the thread count and the newest thread",
    )
    yield Figure(
        "start", f"key press, idle picker of {n} threads (ms)", "ms", [k for r in runs for k in r.picker_keys], 50
    )


def _one_long(directory: Path, messages: int) -> tuple[Path, str]:
    """A store of three threads, the newest of ``messages`` messages; (path, its id)."""
    path = directory / f"long-{messages}.sqlite"
    if not path.exists():
        asyncio.run(fill_threads(path, 2, 10))
        asyncio.run(fill_long_thread(path, messages, thread_id(2)))
    return path, thread_id(2)


def open_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """Open the ``sizes.messages`` thread from the picker; keys in it; RSS."""
    store, newest = _one_long(directory, sizes.messages)
    runs = [
        app_figures.open_run(store, threads=3, newest=newest, key_pairs=sizes.key_pairs) for _ in range(sizes.app_runs)
    ]
    m = f"{sizes.messages:,}"
    yield Figure(
        "open",
        f"open a {m}-message thread from the picker, last message painted (ms)",
        "ms",
        [r.open_ms for r in runs if r.open_ms is not None],
        300,
        percentile=False,
        note="from Enter on the picker's first row until the thread's last message is on screen",
    )
    yield Figure(
        "open", f"key press, idle thread of {m} messages (ms)", "ms", [k for r in runs for k in r.thread_keys], 50
    )
    yield Figure(
        "open",
        f"RSS of the app with a {m}-message thread open (MB)",
        "MB",
        [r.rss / 1e6 for r in runs if r.rss is not None],
        percentile=False,
    )


def load_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """``load`` of one ``sizes.messages`` thread: ours, cubeloop's, LangGraph's ``aget_tuple``."""
    n = sizes.messages
    ours, durability = asyncio.run(store_figures.our_load_ms(directory, n, sizes.repeat))
    label = f"load a thread of {n:,} messages (ms)"
    figure = Figure("load", label, "ms", ours, at_most=40, peer="cubeloop load")
    if note := absent("cubeloop"):
        figure.peer_note = note
    else:
        figure.peer_samples, theirs = asyncio.run(store_figures.cubeloop_load_ms(directory, n, sizes.repeat))
        figure.note = f"ours {durability}; cubeloop {theirs} (its own file)"
    yield figure
    figure = Figure("load", f"{label}, vs LangGraph", "ms", ours, at_most=40, peer="LangGraph aget_tuple")
    if note := absent("langgraph"):
        figure.peer_note = note
    else:
        figure.peer_samples, theirs = asyncio.run(store_figures.langgraph_load_ms(directory, n, sizes.repeat))
        figure.note = f"ours {durability}; LangGraph {theirs}; one checkpoint holding the {n:,} messages"
    yield figure
    yield Figure(
        "load",
        f"floor: read the same {n:,} rows, JSON to dicts only (ms)",
        "ms",
        store_figures.parse_floor_ms(directory, n, sizes.repeat),
        note="no target: what any load building Python objects pays before validation",
    )


def rss_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """The app's RSS with a ``sizes.big``-message thread open (and the open time)."""
    store, newest = _one_long(directory, sizes.big)
    runs = [app_figures.open_run(store, threads=3, newest=newest) for _ in range(max(1, sizes.app_runs - 1))]
    b = f"{sizes.big:,}"
    yield Figure(
        "rss",
        f"RSS of the app with a {b}-message thread open (MB)",
        "MB",
        [r.rss / 1e6 for r in runs if r.rss is not None],
        250,
        percentile=False,
        note="VmRSS of the app process when the last message is on screen, and 1 s later (the larger)",
    )
    yield Figure(
        "rss",
        f"open a {b}-message thread from the picker (ms)",
        "ms",
        [r.open_ms for r in runs if r.open_ms is not None],
        percentile=False,
    )


def append_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """One-message appends to a ``sizes.messages``-row thread, beside cubeloop and LangGraph,
    as shipped and at equal durability."""
    n, k = sizes.messages, sizes.appends
    label = f"append 1 message after {n:,} rows (µs)"
    shipped, ours_d = asyncio.run(store_figures.our_append_us(directory, n, k))
    full, full_d = asyncio.run(store_figures.our_append_us(directory, n, k, durable=True))
    cases = [
        ("as shipped", shipped, ours_d, {}, 150.0),
        ("both synchronous=FULL", full, full_d, {}, None),
        ("both WAL + synchronous=NORMAL", shipped, ours_d, {"wal_normal": True}, None),
    ]
    for words, ours, mine, options, target in cases:
        figure = Figure("append", f"{label}, {words}", "µs", ours, at_most=target, peer="cubeloop append")
        if note := absent("cubeloop"):
            figure.peer_note = note
        else:
            figure.peer_samples, theirs = asyncio.run(store_figures.cubeloop_append_us(directory, n, k, **options))
            figure.note = f"ours {mine}; cubeloop {theirs}"
        yield figure
    few = max(3, k // 10)
    for words, ours, mine, normal in (
        ("LangGraph, both synchronous=FULL (its default)", full, full_d, False),
        ("LangGraph, both WAL + synchronous=NORMAL", shipped, ours_d, True),
    ):
        figure = Figure("append", f"{label}, vs {words}", "µs", ours, peer="LangGraph aput")
        if note := absent("langgraph"):
            figure.peer_note = note
        else:
            figure.peer_samples, theirs = asyncio.run(
                store_figures.langgraph_append_us(directory, n, few, normal=normal)
            )
            figure.note = f"ours {mine}; LangGraph {theirs}; each aput is the next checkpoint, all {n:,}+ messages"
        yield figure


def loop_figures_(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """The loop's cost per model call at ``sizes.messages`` messages of history."""
    n = sizes.messages
    ours = [x for _ in range(3) for x in asyncio.run(loop_figures.our_loop_ms(n, sizes.loop_calls))]
    figure = Figure(
        "loop",
        f"loop cost per model call, {n:,} messages of history (ms)",
        "ms",
        ours,
        percentile=False,
        peer="cubeloop",
        note=f"no store on either side; ours: median gap of {sizes.loop_calls} calls per run, 3 runs; "
        f"cubeloop: each gap of one run of {sizes.peer_calls} calls",
    )
    if note := absent("cubeloop"):
        figure.peer_note = note
    else:
        figure.peer_samples = asyncio.run(loop_figures.cubeloop_loop_ms(n, sizes.peer_calls))
    yield figure


def turns_figures(sizes: Sizes, directory: Path) -> Iterator[Figure]:
    """Tool turns per second on SQLite, as shipped and at equal durability."""
    shipped = [asyncio.run(loop_figures.our_turns_per_s(directory, sizes.turns)) for _ in range(3)]
    full = [asyncio.run(loop_figures.our_turns_per_s(directory, sizes.turns, durable=True)) for _ in range(3)]
    for words, ours, options in (
        ("as shipped", shipped, {}),
        ("both synchronous=FULL", full, {}),
        ("both WAL + synchronous=NORMAL", shipped, {"wal_normal": True}),
    ):
        figure = Figure(
            "turns",
            f"tool turns per second on SQLite, {words}",
            "turns/s",
            [rate for rate, _ in ours],
            percentile=False,
            higher_is_better=True,
            peer="cubeloop",
        )
        if note := absent("cubeloop"):
            figure.peer_note = note
        else:
            theirs = [
                asyncio.run(loop_figures.cubeloop_turns_per_s(directory, sizes.peer_turns, **options)) for _ in range(2)
            ]
            figure.peer_samples = [rate for rate, _ in theirs]
            figure.note = (
                f"ours {ours[0][1]}; cubeloop {theirs[0][1]}; {sizes.turns} / {sizes.peer_turns} turns per run"
            )
        yield figure


RUNNERS: dict[str, Callable[[Sizes, Path], Iterator[Figure]]] = {
    "stream": stream_figures,
    "idle": idle_figures,
    "list": list_figures,
    "start": start_figures,
    "load": load_figures,
    "open": open_figures,
    "rss": rss_figures,
    "append": append_figures,
    "loop": loop_figures_,
    "turns": turns_figures,
}


# --- the command ------------------------------------------------------------------------------


def parse_sizes(text: str, base: Sizes) -> Sizes:
    """``base`` with ``KEY=N`` pairs (comma-separated field names of :class:`Sizes`) applied.
    Raises ``ValueError`` (one sentence) for an unknown key or a value that is not a number."""
    names = {f.name: f.type for f in dataclasses.fields(Sizes)}
    changes: dict[str, float | int] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = pair.partition("=")
        if key not in names:
            raise ValueError(f"--sizes knows {', '.join(names)}; not {key!r}.")
        try:
            changes[key] = float(value) if names[key] in ("float", float) else int(value.replace("_", ""))
        except ValueError:
            raise ValueError(f"--sizes {key} takes a number, not {value!r}.") from None
    return dataclasses.replace(base, **changes)


async def app_durability(directory: Path) -> str:
    """The durability of a SQLite store as the app opens it (``locations.open_store``)."""
    from core.checkpoint import locations

    store = await locations.open_store(directory / "durability.sqlite", create=True)
    try:
        return str(await our_durability(store))
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    """Run the chosen groups and print their figures; returns the exit status (2: bad arguments)."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: shows that every figure runs")
    parser.add_argument("--only", default="", help=f"comma-separated groups: {', '.join(GROUPS)}")
    parser.add_argument("--sizes", default="", help="KEY=N overrides, e.g. threads=2000,messages=5000")
    parser.add_argument("--json", metavar="PATH", help="also write every figure, with its samples, to PATH")
    args = parser.parse_args(argv)
    chosen = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = [g for g in chosen if g not in RUNNERS]
    try:
        if unknown:
            raise ValueError(f"--only takes {', '.join(GROUPS)}; not {', '.join(unknown)}.")
        sizes = parse_sizes(args.sizes, QUICK if args.quick else Sizes())
    except ValueError as error:
        print(f"python -m bench: {error}", file=sys.stderr)
        return 2
    load = os.getloadavg()
    print(
        f"cubepi-tui benchmark · {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} · "
        f"{'quick sizes' if args.quick else 'the issue-10 sizes'}: {sizes.threads:,} threads, {sizes.messages:,} "
        f"messages, {sizes.big:,} for RSS, {sizes.rate:,.0f} tok/s for {sizes.seconds:g} s"
    )
    for peer in ("cubeloop", "langgraph"):
        if note := missing(peer):
            print(note)
    print("met: the p95 against the target where a p95 is shown, else the median; ours/peer below 1: ours is faster")
    print("(for rates, above 1: ours does more per second)\n")
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="cubepi-bench-") as tmp:
        print(
            f"The app's store in the app figures: SQLite as the app opens it, {asyncio.run(app_durability(Path(tmp)))}\n"
        )
        print(HEADER, flush=True)
        for group in chosen:
            started = time.perf_counter()
            try:
                for figure in RUNNERS[group](sizes, Path(tmp)):
                    figures.append(figure)
                    print(line(figure), flush=True)
            except Exception as error:  # one group failing must not hide the others' figures
                failed = Figure(group, f"[{group}]", "", error=f"{type(error).__name__}: {error}")
                figures.append(failed)
                print(line(failed), flush=True)
            print(f"{'':4}({group}: {time.perf_counter() - started:.0f} s)", flush=True)
    if args.json:
        rows = [{**dataclasses.asdict(f), "median": f.median, "p95": f.p95, "met": f.met} for f in figures]
        Path(args.json).write_text(json.dumps({"sizes": dataclasses.asdict(sizes), "figures": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
