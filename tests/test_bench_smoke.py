"""Smoke run of ``python -m bench`` at tiny sizes: every measuring function runs, and no cost
grows more than 2x between two sizes (per item: per thread listed, per message loaded, per
append, per model call, per tool turn). No absolute time is asserted anywhere: speed
targets are the benchmark's to print. The real app runs in a pseudo-terminal here too
(start, open, keys idle and while a reply streams), so the pty path cannot rot.

Peers: cubeloop is in the test extra; LangGraph only in the ``bench`` extra, so its parts
skip with the reason when it is not installed (CI installs the test extra only).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import app_figures, loop_figures, peers, store_figures
from bench.fill import fill_long_thread, fill_threads, thread_id
from bench.report import Figure, median
from bench.terminal import Screen

ATTEMPTS = 3
"""Tries of a growth check: a 2-core machine shared with other work has slow moments."""


async def growth(measure: Callable[[int], Awaitable[float]], small: int, large: int, *, per_item: bool) -> list[float]:
    """Ratios of the cost at ``large`` to the cost at ``small`` (per item when ``per_item``),
    tried until one is at most 2 or :data:`ATTEMPTS` tries are used; the last is the verdict."""
    ratios = []
    for _ in range(ATTEMPTS):
        a, b = await measure(small), await measure(large)
        assert a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b), (a, b)
        ratio = (b / large) / (a / small) if per_item else b / a
        ratios.append(ratio)
        if ratio <= 2:
            break
    return ratios


def needs(peer: str) -> None:
    """Skip with the install sentence when ``peer`` is not installed."""
    if note := peers.missing(peer):
        pytest.skip(note)


async def test_listing_grows_with_threads_at_most_linearly(tmp_path: Path) -> None:
    for threads in (100, 200):
        await fill_threads(tmp_path / f"{threads}.sqlite", threads, 6)

    async def listing(threads: int) -> float:
        return median(await store_figures.list_threads_ms(tmp_path / f"{threads}.sqlite", threads, repeat=3))

    ratios = await growth(listing, 100, 200, per_item=True)
    assert ratios[-1] <= 2, ratios


@pytest.mark.parametrize("peer", [None, "cubeloop", "langgraph"])
async def test_load_grows_with_messages_at_most_linearly(tmp_path: Path, peer: str | None) -> None:
    if peer is not None:
        needs(peer)
    load = {
        None: store_figures.our_load_ms,
        "cubeloop": store_figures.cubeloop_load_ms,
        "langgraph": store_figures.langgraph_load_ms,
    }[peer]

    async def loading(messages: int) -> float:
        samples, durability = await load(tmp_path, messages, repeat=3)
        assert durability.journal_mode in ("wal", "delete") and durability.synchronous in ("NORMAL", "FULL")
        return median(samples)

    ratios = await growth(loading, 200, 400, per_item=True)
    assert ratios[-1] <= 2, ratios


@pytest.mark.parametrize(
    ("peer", "options"),
    [(None, {}), (None, {"durable": True}), ("cubeloop", {}), ("cubeloop", {"wal_normal": True}), ("langgraph", {})],
)
async def test_append_cost_is_flat_in_history(tmp_path: Path, peer: str | None, options: dict[str, bool]) -> None:
    if peer is not None:
        needs(peer)
    append = {
        None: store_figures.our_append_us,
        "cubeloop": store_figures.cubeloop_append_us,
        "langgraph": store_figures.langgraph_append_us,
    }[peer]
    runs = iter(range(100))

    async def appending(history: int) -> float:
        directory = tmp_path / str(next(runs))  # a fresh file per try: the figure is at that history
        directory.mkdir()
        samples, durability = await append(directory, history, 8, **options)
        assert len(samples) == 8
        if options.get("durable"):
            assert durability.synchronous == "FULL"
        if options.get("wal_normal"):
            assert (durability.journal_mode, durability.synchronous) == ("wal", "NORMAL")
        return median(samples)

    # LangGraph writes the whole conversation per checkpoint: its append grows with the history
    # by design, so only that it runs is checked for it.
    ratios = await growth(appending, 200, 400, per_item=False)
    if peer != "langgraph":
        assert ratios[-1] <= 2, ratios


async def test_loop_cost_per_model_call_is_flat_in_history() -> None:
    async def ours(history: int) -> float:
        return median(await loop_figures.our_loop_ms(history, 20))

    ratios = await growth(ours, 200, 400, per_item=False)
    assert ratios[-1] <= 2, ratios


async def test_cubeloop_loop_figure_runs() -> None:
    needs("cubeloop")
    gaps = await loop_figures.cubeloop_loop_ms(60, 3)
    assert len(gaps) == 2 and all(g > 0 for g in gaps)


async def test_tool_turns_cost_per_turn_is_flat(tmp_path: Path) -> None:
    async def seconds_per_run(turns: int) -> float:
        rate, durability = await loop_figures.our_turns_per_s(tmp_path, turns)
        assert durability.journal_mode == "wal"
        return turns / rate

    ratios = await growth(seconds_per_run, 10, 20, per_item=True)
    assert ratios[-1] <= 2, ratios
    needs("cubeloop")
    rate, durability = await loop_figures.cubeloop_turns_per_s(tmp_path, 4, wal_normal=True)
    assert rate > 0 and durability.synchronous == "NORMAL"


async def test_app_start_and_open_in_a_pty_grow_at_most_linearly(tmp_path: Path) -> None:
    """The real app in a pseudo-terminal: start to picker over 100 and 200 threads, open a
    thread of 200 and 400 messages, idle keys on both screens, RSS."""
    stores: dict[int, Path] = {}
    for threads in (100, 200):
        stores[threads] = tmp_path / f"app-{threads}.sqlite"
        await fill_threads(stores[threads], threads - 1, 6)
        await fill_long_thread(stores[threads], threads * 2, thread_id(threads - 1))
    runs: dict[int, app_figures.OpenRun] = {}

    async def start(threads: int) -> float:
        runs[threads] = run = app_figures.open_run(
            stores[threads], threads=threads, newest=thread_id(threads - 1), key_pairs=1, settle=0.1
        )
        assert len(run.picker_keys) == 2 and len(run.thread_keys) == 2
        assert all(k > 0 and math.isfinite(k) for k in run.picker_keys + run.thread_keys)
        assert run.rss is not None and run.rss > 10_000_000  # Python with Textual loaded: a number read
        return run.start_ms

    ratios = await growth(start, 100, 200, per_item=True)
    assert ratios[-1] <= 2, ratios
    small, large = runs[100].open_ms, runs[200].open_ms
    assert small is not None and large is not None
    assert (large / 400) / (small / 200) <= 2, (small, large)


@pytest.mark.parametrize("here", [True, False], ids=["run in the app", "run in another process"])
async def test_keys_while_a_reply_streams_are_measured(tmp_path: Path, here: bool) -> None:
    store = tmp_path / "stream.sqlite"
    await fill_long_thread(store, 20, "streamed")
    result = app_figures.stream_keys(store, "streamed", here=here, rate=2000, seconds=2.0, pause=0.05)
    assert len(result.samples) >= 2
    assert all(0 <= at < 2.0 + 10 and ms > 0 for at, ms in result.samples), result.samples
    assert result.bytes_per_s > 0  # the reply reached the terminal while keys were timed


def test_a_missing_peer_is_one_sentence_not_a_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(peers.PEERS, "langgraph", ("no_such_module_for_the_bench.sub", "LangGraph"))
    monkeypatch.setattr(peers, "_known", {})
    assert peers.missing("langgraph") == f"LangGraph is not installed; {peers.INSTALL}"
    # The load figures then carry the short words instead of a peer figure (cubeloop is in the test extra).
    sizes = bench_main.parse_sizes("messages=50,repeat=2", bench_main.QUICK)
    *figures, floor = bench_main.load_figures(sizes, tmp_path)
    assert [f.peer_note for f in figures] == ["", "LangGraph: not installed (see above)"]
    assert figures[0].peer_samples and not figures[1].peer_samples
    # The floor has no peer and no target, and reads the rows the load read.
    assert floor.label.startswith("floor:") and floor.at_most is None and not floor.peer_note
    assert len(floor.samples) == 2 and all(ms > 0 for ms in floor.samples)


def test_the_command_refuses_unknown_groups_and_sizes_in_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--only", "list,nonsense"]) == 2
    assert bench_main.main(["--sizes", "threads=many"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"python -m bench: --only takes {', '.join(bench_main.GROUPS)}; not nonsense.",
        "python -m bench: --sizes threads takes a number, not 'many'.",
    ]


def test_the_command_prints_one_line_per_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--quick", "--only", "list", "--sizes", "threads=60"]) == 0
    out = capsys.readouterr().out
    listing = [line for line in out.splitlines() if line.startswith("list_threads on 60 threads")]
    assert len(listing) == 1
    assert "<= 200 ms" in listing[0] and "no thread listing API" in listing[0]


def test_a_figure_judges_its_p95_and_its_ratio() -> None:
    figure = Figure("x", "x", "ms", [10, 20, 30, 40, 100], at_most=50, peer="p", peer_samples=[60])
    assert figure.p95 == 100 and figure.median == 30
    assert figure.met is False
    assert figure.ratio == 0.5
    assert Figure("x", "x", "ms", [10, 20], at_most=50, percentile=False).met is True


def test_the_screen_emulator_reads_output_split_anywhere() -> None:
    """What Textual writes (alternate screen, cursor moves, styles, erases, a wide character)
    lands in the same cells however the reads split it, even inside an escape sequence."""
    output = (
        "\x1b[?1049h\x1b[?25l\x1b]0;title\x07\x1b[2;3H\x1b[1;38;2;10;20;30mhelp\x1b[0m 日本"
        "\x1b[4;1Hline four\x1b[4;5H\x1b[K\x1b[1;1Hxy\x1b[2C!\r\nz"
    )
    whole = Screen(12, 5)
    whole.feed(output)
    assert whole.text().splitlines() == ["xy  !       ", "z help 日本 ", " " * 12, "line        ", " " * 12]
    for cut in range(1, len(output)):
        split = Screen(12, 5)
        split.feed(output[:cut])
        split.feed(output[cut:])
        assert split.text() == whole.text(), cut
