"""Benchmark: the real app's worst main-thread stall while a tool floods its output.

Run: ``.venv/bin/python -m bench.bench_tool_output [--modes lines,blob,frames] [--repeat 3]``

Each mode runs the real app (``tui.app.make_app``, the CLI's session) in a tmux terminal
(``/work/shared/tools/tui_drive.sh``, 100x30) on a fresh SQLite file, with one tool,
``flood``, that the scripted model calls once:

* ``quiet``: the baseline, 10 short lines reported and returned (the app's own stalls
  around a tool call: mounting the reply, restyling the call when it ends).
* ``lines``: 50,000 lines, each reported as progress text as it is produced (the event
  loop is yielded to every 50 lines); the result is the whole 50,000-line text (~3.2 MB).
* ``blob``: 2 MB without a newline, reported as the output so far every 64 KiB (the text
  grows to 2 MB); the result is the 2 MB.
* ``frames``: 10,000 ``\\r`` progress frames (a progress bar redrawn in place), reported
  as the output so far every 20 frames; the result is all 10,000 frames.

While the tool runs and for three seconds after its result, a task on the app's event
loop sleeps 5 ms at a time and records how late it wakes: the loop's stall, i.e. how
long a key press would wait. Printed per mode: the worst stall and the 99th percentile
(medians over ``--repeat`` runs), the tool's own duration, and the main thread's CPU
seconds in the phase (``time.thread_time``: what the app itself spent, much less
disturbed than wall-clock stalls by other processes on a loaded machine). Then, with the result on
screen (``--pager``), the tool call is focused (``t``), expanded and collapsed (``x``
twice), and the pager is opened (``p``) and searched (``/``, a word, Enter, ``n``, ``N``);
the worst stall during that is printed too (the keys exist only after this change).

With ``BENCH_PROFILE=FILE`` in the environment each app child runs under cProfile and
dumps its statistics to FILE (the last run's survive), to find what a stall is made of.

Not a test: it prints, it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.tools import ToolContext, tool

ROOT = Path(__file__).resolve().parent.parent
DRIVE = "/work/shared/tools/tui_drive.sh"
MODES = ("quiet", "lines", "blob", "frames")
SETTLE = 3.0
"""Seconds after the tool's result during which stalls still count (the result is drawn)."""


# --- the child: the real app with the flood tool ----------------------------------------------


class _Monitor:
    """Samples the event loop's lateness every 5 ms between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.worst_at = 0.0  # wall-clock time (time.time()) the worst stall ended
        self.cpu = 0.0  # main-thread CPU seconds (time.thread_time) between start and stop
        self._cpu_from = 0.0
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task is None:
            self._cpu_from = time.thread_time()
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            late = time.perf_counter() - before - 0.005
            if not self.samples or late > max(self.samples):
                self.worst_at = time.time()
            self.samples.append(late)

    def stop(self) -> list[float]:
        if self.task is not None:
            self.task.cancel()
            self.task = None
            self.cpu = time.thread_time() - self._cpu_from
        samples, self.samples = self.samples, []
        return samples


def _flood_text(mode: str) -> str:
    if mode == "quiet":
        return "\n".join(f"step {i}" for i in range(10))
    if mode == "lines":
        return "\n".join(
            f"line {i:05d}: the quick brown fox jumps over the lazy dog {i * 7 % 1000}" for i in range(50_000)
        )
    if mode == "blob":
        return ("abcdefghij" * 209_716)[: 2 * 1024 * 1024]
    return "".join(f"\rprogress {i + 1:5d}/10000 [{'#' * ((i + 1) * 40 // 10_000):<40}]" for i in range(10_000))


def child(mode: str, db: str, out: str) -> None:
    """Run the app on ``db`` with the flood tool in ``mode``; write the stalls to ``out`` (JSON)."""
    import gc

    from core.messages import ToolResultMessage
    from core.providers.faux import FauxProvider, faux_reply, faux_text, faux_tool_call
    from tui.app import make_app
    from tui.cli import build_session

    monitor = _Monitor()
    watcher: list[asyncio.Task[None]] = []  # keeps the task referenced
    figures: dict[str, object] = {"mode": mode}

    @tool
    async def flood(ctx: ToolContext) -> str:
        """Produce a flood of output."""
        monitor.start()
        started = time.perf_counter()
        text = _flood_text(mode)
        if mode in ("lines", "quiet"):
            lines = text.split("\n")
            for i, line in enumerate(lines):
                ctx.report(progress=i / len(lines), text=line)
                if i % 50 == 49:
                    await asyncio.sleep(0)
        elif mode == "blob":
            for end in range(65536, len(text) + 65536, 65536):
                ctx.report(progress=end / len(text), text=text[:end])
                await asyncio.sleep(0)
        else:
            frame = len(text) // 10_000
            for i in range(20, 10_001, 20):
                ctx.report(progress=i / 10_000, text=text[: i * frame])
                await asyncio.sleep(0)
        figures["tool_s"] = time.perf_counter() - started
        watcher.append(asyncio.get_running_loop().create_task(watch_for_end()))
        return text

    def respond(request: object) -> object:
        messages = list(request.messages)  # type: ignore[attr-defined]
        if any(isinstance(m, ToolResultMessage) for m in messages):
            return faux_reply(faux_text("flood finished"))
        return faux_reply(faux_tool_call("flood", {}))

    session = build_session(
        db,
        demo=True,
        tools=[flood],
        make_provider=lambda: FauxProvider(fallback=respond, model="demo", delay=0.001, record=False),
    )
    app = make_app(session)
    original = app.exit

    def stop_streaming_phase() -> None:
        figures["stream_worst_at"] = monitor.worst_at
        figures["stream"] = monitor.stop()
        figures["stream_cpu"] = monitor.cpu

    app.stop_streaming_phase = stop_streaming_phase  # type: ignore[attr-defined]
    gc.set_threshold(10_000, 50, 100)  # as tui.cli.main

    def exit_and_save(*args: object, **kwargs: object) -> None:
        figures.setdefault("stream", [])
        figures["pager_worst_at"] = monitor.worst_at
        figures["pager"] = monitor.stop()
        figures["pager_cpu"] = monitor.cpu
        Path(out).write_text(json.dumps(figures))
        original(*args, **kwargs)  # type: ignore[arg-type]

    app.exit = exit_and_save  # type: ignore[method-assign]

    async def watch_for_end() -> None:
        # The streaming phase ends SETTLE seconds after "flood finished" is on screen.
        from textual.widgets import Markdown

        while True:
            await asyncio.sleep(0.05)
            if any("flood finished" in str(getattr(m, "source", "")) for m in app.screen.query(Markdown)):
                break
        await asyncio.sleep(SETTLE)
        stop_streaming_phase()
        monitor.start()  # the pager phase
        Path(out + ".phase").write_text("pager")

    profile_to = os.environ.get("BENCH_PROFILE")
    if profile_to:
        import cProfile

        with cProfile.Profile() as profile:
            app.run()
        profile.dump_stats(profile_to)
    else:
        app.run()


# --- the parent: drive each mode in tmux ------------------------------------------------------


def _summary(samples: list[float]) -> tuple[float, float]:
    if not samples:
        return float("nan"), float("nan")
    ordered = sorted(samples)
    return ordered[-1] * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def run_once(mode: str, pager: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "figures.json")
        db = os.path.join(tmp, "flood.sqlite")
        command = f"cd {ROOT} && {sys.executable} -m bench.bench_tool_output --child {mode} --db {db} --out {out}"
        steps = [
            "wait:New thread",
            "sleep:2",
            "key:n",
            "sleep:0.5",
            "text:go",
            "key:Enter",
            "wait:flood finished",
            "sleep:4",
        ]
        if pager:
            steps += ["key:t", "sleep:0.5", "key:x", "sleep:2", "snap:expanded", "key:x", "sleep:1"]
            steps += ["key:p", "sleep:2", "snap:pager"]
            steps += ["key:/", "text:lazy", "key:Enter", "sleep:1", "key:n", "sleep:1", "key:N", "sleep:1"]
            steps += ["snap:searched", "key:Escape", "sleep:0.5", "key:Escape", "sleep:0.5"]
        steps += ["key:C-q", "sleep:2"]
        done = subprocess.run(
            ["bash", DRIVE, "-c", command, "-g", "100x30", "-T", "240", "-R", "180", "--", *steps],
            capture_output=True,
            text=True,
        )
        capture = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if not os.path.exists(out):
            final = Path(capture, "final.txt").read_text() if capture and Path(capture, "final.txt").exists() else ""
            raise SystemExit(f"{mode}: the app wrote no figures (drive exit {done.returncode}).\n{final[-3000:]}")
        figures = json.loads(Path(out).read_text())
        figures["capture"] = capture
        return figures


def _step_before(figures: dict[str, object]) -> str:
    """The driver's last step (its run.log) before the pager phase's worst stall ended."""
    when = float(figures.get("pager_worst_at") or 0)
    log = Path(str(figures["capture"]), "run.log")
    if not when or not log.exists():
        return "?"
    day = time.strftime("%Y-%m-%d ", time.localtime(when))
    last = "?"
    for line in log.read_text().splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            at = time.mktime(time.strptime(day + stamp.split(".")[0], "%Y-%m-%d %H:%M:%S")) + float(
                "0." + stamp.split(".")[1]
            )
        except (ValueError, IndexError):
            continue
        if at <= when and rest.startswith("step"):
            last = rest
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pager", action="store_true", help="also open and search the pager")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.db, args.out)
        return
    print(f"{'mode':8} {'worst stall ms':>15} {'p99 ms':>8} {'tool s':>7} {'CPU s':>6}   runs (worst ms)")
    for mode in args.modes.split(","):
        runs = [run_once(mode, args.pager) for _ in range(args.repeat)]
        worst = [_summary(r["stream"])[0] for r in runs]  # type: ignore[arg-type]
        p99 = [_summary(r["stream"])[1] for r in runs]  # type: ignore[arg-type]
        tool_s = [float(r.get("tool_s", float("nan"))) for r in runs]  # type: ignore[arg-type]
        cpu = statistics.median(float(r.get("stream_cpu", float("nan"))) for r in runs)  # type: ignore[arg-type]
        line = (
            f"{mode:8} {statistics.median(worst):15.0f} {statistics.median(p99):8.0f}"
            f" {statistics.median(tool_s):7.2f} {cpu:6.2f}"
        )
        print(line + "   " + ", ".join(f"{w:.0f}" for w in worst), flush=True)
        if args.pager:
            pager = [_summary(r["pager"])[0] for r in runs]  # type: ignore[arg-type]
            pager_cpu = statistics.median(float(r.get("pager_cpu", float("nan"))) for r in runs)  # type: ignore[arg-type]
            print(
                f"{'  pager':8} {statistics.median(pager):15.0f} {'':8} {'':7} {pager_cpu:6.2f}   runs: "
                + ", ".join(f"{w:.0f}" for w in pager)
            )
            print(f"  last capture: {runs[-1]['capture']}; worst pager stall after: {_step_before(runs[-1])}")


if __name__ == "__main__":
    main()
