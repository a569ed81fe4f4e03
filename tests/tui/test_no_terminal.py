"""The app started without a terminal exits at once with one sentence, instead of spinning.

Before, with stdin from /dev/null Textual's input thread read end-of-file in a loop and
the app ran at 100 % CPU forever, drawing on a pipe nobody read.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from tui.cli import NO_TERMINAL

LIVENESS = 60.0  # seconds; a bound for a process that should exit at once, not a speed check
SENTENCE = (
    "cubepi-tui: The app needs a terminal, and its {};"
    ' to run a thread without a terminal use `cubepi-tui run --db PATH --thread ID "prompt"`.\n'
)


def _app(tmp_path: Path, **streams: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", "--demo", str(tmp_path / "threads.sqlite")],
        text=True,
        timeout=LIVENESS,
        check=False,
        env=env,
        **streams,  # type: ignore[call-overload]
    )


def test_no_terminal_at_all_exits_with_one_sentence(tmp_path: Path) -> None:
    done = _app(tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert done.returncode == NO_TERMINAL == 1
    assert done.stderr == SENTENCE.format("standard input and standard error are not terminals")
    assert done.stdout == ""
    assert not (tmp_path / "threads.sqlite").exists()  # nothing was opened or created


def test_keys_from_a_terminal_but_the_screen_piped_exits_too(tmp_path: Path) -> None:
    main, child = pty.openpty()
    try:
        done = _app(tmp_path, stdin=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        os.close(child)
        os.close(main)
    assert done.returncode == NO_TERMINAL
    assert done.stderr == SENTENCE.format("standard error is not one")


def test_help_still_works_without_a_terminal(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", "--help"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIVENESS,
        check=False,
    )
    assert done.returncode == 0 and "cubepi-tui run" in done.stdout
