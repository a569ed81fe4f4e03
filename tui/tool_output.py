"""What a tool's output looks like on screen: ``\\r`` frames collapsed, head and tail, long lines cut.

A tool may print anything: 50,000 lines, 2 MB without a newline, a progress bar redrawn
10,000 times with ``\\r``. This module turns such text into what the app shows, in time
linear in the text and with a bounded result:

* :func:`collapse_frames` shows a line the way a terminal leaves it: each ``\\r`` moves
  back to the line's start and what follows overwrites ("a\\rb" -> "b"); ``\\r\\n`` is a
  plain newline.
* :func:`excerpt` keeps the first and the last lines of a :class:`Window` with
  "… N lines hidden …" between, and cuts a line longer than the window's width to its
  start and end with "… N characters hidden …".
* :func:`output_lines` gives every line, collapsed and cleaned, for the pager
  (:mod:`tui.screens.pager`); :func:`output_chunks` the same a piece at a time, so the
  pager can read 50,000 lines without holding the event loop.

Every character shown goes through :func:`tui.text.clean` / :func:`tui.text.literal` (the
one sanitiser): markup and terminal escapes appear as text. Pure: no widgets.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from rich.text import Text

from tui.text import clean, literal

MARK_STYLE = "dim italic"
"""The style of what this module adds (the "hidden" notes), so it never reads as output."""


def count_lines(n: int) -> str:
    """``n`` lines in words, with thousands separators: "1 line", "50,000 lines"."""
    return f"{n:,} line" if n == 1 else f"{n:,} lines"


@dataclass(frozen=True, slots=True)
class Window:
    """How much of an output is shown.

    ``head`` lines from the start and ``tail`` lines from the end (either may be 0); a
    line longer than ``width`` characters shows its first three quarters and last quarter
    of ``width``; ``budget`` characters in all (half for the head, half for the tail when
    both are shown), so many long lines cannot fill the screen either. All counts are
    characters (code points) of the raw text, before cleaning.
    """

    head: int
    tail: int
    width: int
    budget: int


COLLAPSED = Window(head=8, tail=8, width=400, budget=4000)
"""A finished call's result by default: its first and last 8 lines, at most 4,000
characters (the old ``RESULT_CHAR_LIMIT``), about 60 screen rows at 80 columns. It is
drawn as one Rich text, whose wrapping costs about 0.6 ms per line here (measured: a
100-line excerpt took 60 ms on top of the frame), so more is never drawn that way: the
expanded view and the pager draw only the rows on screen (``tui.screens.pager.OutputView``)."""

PROGRESS = Window(head=0, tail=3, width=300, budget=900)
"""A running call's progress text: its last 3 lines, a line at most 300 characters."""


@dataclass(frozen=True, slots=True)
class Excerpt:
    """What :func:`excerpt` made of an output.

    ``text`` is what to show (cleaned, notes dimmed); ``lines`` the output's line count;
    ``lines_shown`` and ``lines_hidden`` split it; ``chars_hidden`` counts the characters
    left out of the lines that were cut (raw characters, after ``\\r`` frames collapsed).
    """

    text: Text
    lines: int
    lines_shown: int
    lines_hidden: int
    chars_hidden: int

    @property
    def complete(self) -> bool:
        """Whether nothing was left out."""
        return self.lines_hidden == 0 and self.chars_hidden == 0


def collapse_frames(line: str) -> str:
    """``line`` as a terminal leaves it: each ``\\r`` returns to column 0 and the next
    characters overwrite the earlier ones (ECMA-48 CR: the cursor moves, nothing is erased).

    ``"a\\rb"`` -> ``"b"``; ``"10%\\r100%"`` -> ``"100%"``; ``"abc\\r"`` (a frame then a
    bare return) -> ``"abc"``; ``"abcdef\\rxy"`` -> ``"xycdef"``. A column is one
    character here (wide characters and tabs are not measured). Linear in ``len(line)``:
    the frames are read from the last, and each adds only its part beyond what is already
    known.
    """
    if "\r" not in line:
        return line
    frames = line.split("\r")
    shown = frames[-1]
    for frame in reversed(frames[:-1]):
        if len(frame) > len(shown):
            shown += frame[len(shown) :]
    return shown


def _cut(line: str, width: int) -> tuple[Text, int]:
    """``line`` (raw, collapsed) as shown in ``width`` characters, and how many were left out."""
    if len(line) <= width:
        return literal(line), 0
    keep_end = width // 4
    keep_start = width - keep_end
    hidden = len(line) - keep_start - keep_end
    shown = literal(line[:keep_start])
    shown.append(f" … {hidden:,} characters hidden … ", style=MARK_STYLE)
    shown.append_text(literal(line[len(line) - keep_end :] if keep_end else ""))
    return shown, hidden


def _line_count(raw: str, end: int) -> int:
    return raw.count("\n", 0, end) + 1 if end else 0


def excerpt(raw: str, window: Window) -> Excerpt:
    """Make what is shown of the tool output ``raw`` through ``window`` (see :class:`Window`).

    Lines are split at ``\\n`` only (a trailing newline ends the last line, it does not
    start an empty one); each shown line has its ``\\r`` frames collapsed
    (:func:`collapse_frames`), is cut to ``window.width``, and is cleaned. Linear in
    ``len(raw)`` (one count of newlines, then only the shown lines are touched); the
    result holds at most ``window.head + window.tail`` lines and about ``window.budget``
    characters plus the notes (a cleaned character may read as up to six, ``\\udcff``).
    """
    end = len(raw) - 1 if raw.endswith("\n") else len(raw)
    total = _line_count(raw, end)
    both = window.head > 0 and window.tail > 0
    head_budget = window.budget // 2 if both else window.budget
    head: list[Text] = []
    tail: list[Text] = []
    chars_hidden = 0
    used = 0
    pos = 0  # start of the next head line
    while len(head) < window.head and pos <= end and used < head_budget and total:
        stop = raw.find("\n", pos, end)
        stop = end if stop < 0 else stop
        line = collapse_frames(raw[pos:stop])
        shown, hidden = _cut(line, min(window.width, head_budget - used))
        head.append(shown)
        chars_hidden += hidden
        used += len(line) - hidden
        pos = stop + 1
    tail_budget = window.budget - used if both else window.budget
    used = 0
    back = end  # end of the next tail line (exclusive)
    while len(tail) < window.tail and back >= pos and used < tail_budget and len(head) + len(tail) < total:
        start = raw.rfind("\n", pos, back) + 1
        start = max(start, pos)
        line = collapse_frames(raw[start:back])
        shown, hidden = _cut(line, min(window.width, tail_budget - used))
        tail.append(shown)
        chars_hidden += hidden
        used += len(line) - hidden
        back = start - 1
    tail.reverse()
    lines_shown = len(head) + len(tail)
    hidden_lines = total - lines_shown
    text = Text()
    parts: list[Text] = [*head]
    if hidden_lines:
        parts.append(Text(f"… {count_lines(hidden_lines)} hidden …", style=MARK_STYLE))
    parts.extend(tail)
    for i, part in enumerate(parts):
        if i:
            text.append("\n")
        text.append_text(part)
    return Excerpt(text, total, lines_shown, hidden_lines, chars_hidden)


CHUNK_CHARS = 65_536
"""About how many characters :func:`output_chunks` turns into lines at a time. Cleaning
and splitting 64 KiB takes about a millisecond here, so a reader that yields to the event
loop between chunks never stalls it for long; a longer single line is one chunk."""


def _piece_lines(piece: str) -> list[str]:
    if "\r" in piece:
        piece = "\n".join(collapse_frames(line) for line in piece.split("\n"))
    text = clean(piece)
    if "\t" in text:
        text = text.expandtabs()  # the pager draws cells, not Rich text: tabs become spaces here
    return text.split("\n")


def output_chunks(raw: str, chunk: int = CHUNK_CHARS) -> Iterator[list[str]]:
    """:func:`output_lines` of ``raw`` in pieces: consecutive lists of lines, each from
    about ``chunk`` characters (a piece ends at a line end, so a line longer than
    ``chunk`` is one piece). Concatenated they are exactly ``output_lines(raw)``."""
    end = len(raw) - 1 if raw.endswith("\n") else len(raw)
    if not end:
        return
    pos = 0
    while pos <= end:
        stop = raw.find("\n", min(pos + chunk, end), end)
        stop = end if stop < 0 else stop
        yield _piece_lines(raw[pos:stop])
        pos = stop + 1


def output_lines(raw: str) -> list[str]:
    """Every line of ``raw``, ``\r`` frames collapsed, cleaned, tabs expanded: the full
    text as the pager shows it (split at ``\n``; a trailing newline starts no empty line).
    Linear in ``len(raw)``: one split, one collapse per line holding ``\r``, one clean."""
    return list(itertools.chain.from_iterable(output_chunks(raw, len(raw) + 1)))
