"""App figures, measured on the real app in a pseudo-terminal (:mod:`bench.terminal`).

The app is ``python -m bench.paced_app -- STORE ...``: ``cubepi-tui`` itself, built by its
CLI, with a model that streams at a fixed rate (:mod:`bench.paced_app`). Every time is
from writing bytes to the terminal (or starting the process) until the terminal's screen
shows the result:

* a key press: ``?`` until the help screen is on screen, then Escape until it is gone
  again; each is one sample (ms);
* start: process start until the picker shows the newest thread and the thread count;
* open: Enter on the picker's first row (the thread of N messages, the newest) until its
  last message is on screen; the app's RSS (``VmRSS``) then;
* while a reply streams: the same key presses, each stamped with the seconds since the
  reply's first tokens reached the screen, the reply run in the app (``n``, the prompt,
  Enter: typed) or by ``cubepi-tui run`` in another process that the app follows.
"""

from __future__ import annotations

import compileall
import functools
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.fill import FINAL_MARK, thread_id
from bench.paced_app import RATE_ENV, SECONDS_ENV
from bench.terminal import ENTER, ESCAPE, AppTerminal, rss_bytes

ROOT = Path(__file__).resolve().parent.parent

HELP_TITLE = "cubepi-tui help"
"""The help screen's title: on screen exactly while the help is shown."""

STREAMED = re.compile(r"w\d\d w\d\d w\d\d")
"""Three tokens of :class:`bench.bench_live.PacedProvider`'s text: the reply is on screen."""

KEY_TIMEOUT = 30.0
"""Seconds a key press may take before the benchmark gives up on the app (far past any target)."""


def app_argv(store: Path, *options: str, rate: float = 5000.0, seconds: float = 30.0) -> list[str]:
    """The command line of the app on ``store`` with the paced model."""
    return [
        sys.executable,
        "-m",
        "bench.paced_app",
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--",
        str(store),
        *options,
    ]


def app_terminal(argv: Sequence[str]) -> AppTerminal:
    """A 120 x 40 terminal for ``argv`` (see :func:`app_argv`), run from the repository root,
    once the project's bytecode is written (:func:`compile_project`). The app's settings (its
    collector thresholds among them) are its own; only the terminal is ours."""
    compile_project()
    return AppTerminal(argv, cols=120, rows=40, cwd=ROOT)


@functools.cache
def compile_project() -> None:
    """Write the bytecode of the project's modules, once per benchmark run, as ``pip install``
    does for an installed package (its default ``--compile``). An editable checkout under
    ``PYTHONDONTWRITEBYTECODE=1`` (this machine's shell) has none, so every start of the app
    compiled the ~56 modules it imports again, ~95 ms of CPU (measured) that a user's
    installed app never pays. ``py_compile`` writes whatever that variable says; the app
    still only reads the files."""
    for package in ("core", "tui", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)


def _help_shown(screen: str) -> bool:
    return HELP_TITLE in screen


def _help_gone(screen: str) -> bool:
    return HELP_TITLE not in screen


def press_help(term: AppTerminal) -> tuple[float, float]:
    """One ``?`` then one Escape: (ms until the help is on screen, ms until it is gone).
    Raises ``TimeoutError`` when either takes over :data:`KEY_TIMEOUT` seconds."""
    shown = term.press(b"?", _help_shown, KEY_TIMEOUT)
    if shown is None:
        raise TimeoutError(f"The help screen did not show within {KEY_TIMEOUT:.0f} s of '?'.")
    gone = term.press(ESCAPE, _help_gone, KEY_TIMEOUT)
    if gone is None:
        raise TimeoutError(f"The help screen did not close within {KEY_TIMEOUT:.0f} s of Escape.")
    return shown * 1000, gone * 1000


def idle_keys(term: AppTerminal, count: int, pause: float = 0.1) -> list[float]:
    """``count`` help open/close pairs on an idle app: every key's ms (2 per pair)."""
    out: list[float] = []
    for _ in range(count):
        out.extend(press_help(term))
        time.sleep(pause)
    return out


@dataclass
class OpenRun:
    """One start of the app on a store: start to painted picker, keys on the picker, then
    (when opened) the newest thread to its last message, keys there, and the RSS then."""

    start_ms: float
    picker_keys: list[float] = field(default_factory=list)
    open_ms: float | None = None
    rss: int | None = None
    """Bytes, once the thread was open (``None``: not opened)."""
    thread_keys: list[float] = field(default_factory=list)


def _picker_painted(newest: str, count: int) -> re.Pattern[str]:
    digits = f"{count:,}".replace(",", ",?")
    return re.compile(rf"·\s*{digits}\b[\s\S]*{re.escape(newest)}")


def open_run(
    store: Path,
    *,
    threads: int,
    newest: str,
    key_pairs: int = 0,
    open_thread: bool = True,
    settle: float = 1.0,
    timeout: float = 120.0,
) -> OpenRun:
    """Start the app on ``store`` (``threads`` threads, ``newest`` the most recent, its last
    message holding :data:`bench.fill.FINAL_MARK`) and measure an :class:`OpenRun`:
    ``key_pairs`` help open/close pairs on the picker, then, with ``open_thread``, Enter on
    the first row and as many pairs in the thread; ``settle`` seconds after each paint
    before the keys. Raises ``TimeoutError`` past ``timeout`` seconds for a paint."""
    painted = _picker_painted(newest, threads)
    with app_terminal(app_argv(store)) as term:
        at = term.wait_for(lambda s: painted.search(s) is not None, timeout)
        if at is None:
            raise TimeoutError(f"The picker did not show {newest} and {threads:,} threads within {timeout:.0f} s.")
        run = OpenRun((at - term.started_at) * 1000)
        time.sleep(settle)
        run.picker_keys = idle_keys(term, key_pairs)
        if not open_thread:
            return run
        opened = term.press(ENTER, lambda s: FINAL_MARK in s, timeout)  # the picker shows first prompts only
        if opened is None:
            raise TimeoutError(f"Thread {newest}'s last message was not on screen within {timeout:.0f} s of Enter.")
        run.open_ms = opened * 1000
        rss = rss_bytes(term.pid)
        time.sleep(settle)
        run.rss = max(rss, rss_bytes(term.pid))
        run.thread_keys = idle_keys(term, key_pairs)
    return run


@dataclass
class StreamKeys:
    """Key presses while one reply streamed: (seconds into the reply, ms) per key."""

    where: str
    samples: list[tuple[float, float]] = field(default_factory=list)
    bytes_per_s: float = 0.0
    """What the app wrote to the terminal per second meanwhile."""
    reader_share: float = 0.0
    """The share of one core the benchmark's screen emulation took meanwhile (0-1)."""

    def within(self, start: float, end: float) -> list[float]:
        """The ms of the keys pressed between ``start`` and ``end`` seconds into the reply."""
        return [ms for at, ms in self.samples if start <= at < end]


def stream_keys(
    store: Path,
    thread: str,
    *,
    here: bool,
    rate: float,
    seconds: float,
    pause: float = 0.15,
    timeout: float = 120.0,
) -> StreamKeys:
    """Open ``thread`` (in ``store``, its last message holding :data:`bench.fill.FINAL_MARK`),
    start a reply of ``seconds`` at ``rate`` tokens per second - typed in the app
    (``here``) or run by ``cubepi-tui run`` in another process - and press ``?`` / Escape
    until the reply ends. Raises ``TimeoutError`` when the app does not show the thread or
    the reply within ``timeout`` seconds, or a key within :data:`KEY_TIMEOUT`."""
    result = StreamKeys("in the app" if here else "in another process")
    child: subprocess.Popen[bytes] | None = None
    with app_terminal(app_argv(store, "--thread", thread, rate=rate, seconds=seconds)) as term:
        if term.wait_for(lambda s: FINAL_MARK in s, timeout) is None:
            raise TimeoutError(f"Thread {thread} was not on screen within {timeout:.0f} s.")
        time.sleep(0.5)
        try:
            if here:
                if term.press(b"n", lambda s: "New prompt" in s, timeout) is None:
                    raise TimeoutError("The new-prompt box did not open.")
                term.type_text("Stream.")
                term.write(ENTER)
            else:
                env = {**os.environ, RATE_ENV: str(rate), SECONDS_ENV: str(seconds)}
                command = ["run", "--db", str(store), "--thread", thread, "--agent", "bench.paced_app:paced_agent"]
                child = subprocess.Popen(
                    [sys.executable, "-m", "tui.cli", *command, "Stream."],
                    cwd=ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            began = term.wait_for(lambda s: STREAMED.search(s) is not None, timeout)
            if began is None:
                raise TimeoutError(f"The reply was not on screen within {timeout:.0f} s.")
            read_before, reader_before = term.bytes_read, term.reader_seconds
            while time.perf_counter() - began < seconds - 0.3:
                at = time.perf_counter() - began
                shown, gone = press_help(term)
                result.samples += [(at, shown), (at + shown / 1000, gone)]
                time.sleep(pause)
            elapsed = time.perf_counter() - began
            result.bytes_per_s = (term.bytes_read - read_before) / elapsed
            result.reader_share = (term.reader_seconds - reader_before) / elapsed
        finally:
            if child is not None:
                try:
                    child.wait(timeout)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    return result


def stream_threads(count: int) -> tuple[list[str], list[str]]:
    """The ids of the threads :func:`stream_keys` uses: ``count`` run here, ``count`` elsewhere."""
    return [thread_id(i) for i in range(count)], [thread_id(count + i) for i in range(count)]
