"""tui.tool_output: \\r frames collapsed, head and tail, long lines cut, escapes literal, linear cost."""

from __future__ import annotations

import pytest

import tui.tool_output as tool_output
from tui.tool_output import (
    CHUNK_CHARS,
    COLLAPSED,
    PROGRESS,
    Window,
    collapse_frames,
    count_lines,
    excerpt,
    output_chunks,
    output_lines,
)


def numbered(n: int) -> str:
    return "\n".join(f"line {i}" for i in range(n))


# --- \r frames -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\rb", "b"),
        ("10%\r55%\r100%", "100%"),
        ("abc\r", "abc"),  # a frame then a bare return: the terminal still shows the frame
        ("abcdef\rxy", "xycdef"),  # overwritten, not erased
        ("\r\r", ""),
        ("plain", "plain"),
    ],
)
def test_collapse_frames_as_a_terminal_shows_them(raw: str, shown: str) -> None:
    assert collapse_frames(raw) == shown


def test_crlf_is_a_newline_and_frames_collapse_per_line() -> None:
    raw = "one\r\ntwo 1/3\rtwo 2/3\rtwo 3/3\r\nthree\n"
    assert excerpt(raw, COLLAPSED).text.plain == "one\ntwo 3/3\nthree"
    assert output_lines(raw) == ["one", "two 3/3", "three"]


def test_ten_thousand_frames_show_as_the_latest_one() -> None:
    raw = "".join(f"\rprogress {i:5d}/10000" for i in range(1, 10_001))
    shown = excerpt(raw, PROGRESS)
    assert shown.text.plain == "progress 10000/10000"
    assert "␍" not in shown.text.plain and shown.complete


# --- head and tail -------------------------------------------------------------------------------


def test_head_and_tail_with_the_hidden_count_between() -> None:
    shown = excerpt(numbered(100), Window(head=3, tail=2, width=100, budget=10_000))
    assert shown.text.plain.split("\n") == ["line 0", "line 1", "line 2", "… 95 lines hidden …", "line 98", "line 99"]
    assert (shown.lines, shown.lines_shown, shown.lines_hidden) == (100, 5, 95)
    assert not shown.complete


def test_the_hidden_note_is_dimmed_not_output() -> None:
    shown = excerpt(numbered(100), COLLAPSED)
    note = "… 84 lines hidden …"
    start = shown.text.plain.index(note)
    assert any(s.start == start and s.end == start + len(note) and "dim" in str(s.style) for s in shown.text.spans)


@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 17])
def test_a_short_output_is_shown_whole(n: int) -> None:
    shown = excerpt(numbered(n), COLLAPSED)  # 8 + 8 lines fit 16
    if n <= 16:
        assert shown.text.plain == numbered(n) and shown.complete and shown.lines == n
    else:
        assert shown.lines_hidden == n - 16 and f"… {count_lines(n - 16)} hidden …" in shown.text.plain


def test_trailing_newline_starts_no_empty_line() -> None:
    assert excerpt("a\nb\n", COLLAPSED).lines == 2
    assert excerpt("a\n\n", COLLAPSED).text.plain == "a\n"


def test_progress_window_shows_only_the_last_lines() -> None:
    shown = excerpt(numbered(50_000), PROGRESS)
    assert shown.text.plain.split("\n") == ["… 49,997 lines hidden …", "line 49997", "line 49998", "line 49999"]


# --- long lines ----------------------------------------------------------------------------------


def test_a_long_line_shows_its_start_and_end_with_the_hidden_count() -> None:
    raw = "S" * 1000 + "E" * 1000
    shown = excerpt(raw, Window(head=5, tail=5, width=100, budget=10_000))
    assert shown.text.plain == "S" * 75 + " … 1,900 characters hidden … " + "E" * 25
    assert shown.chars_hidden == 1900 and shown.lines == 1 and not shown.complete


def test_two_megabytes_without_a_newline_is_bounded() -> None:
    raw = "x" * (2 * 1024 * 1024)
    shown = excerpt(raw, COLLAPSED)
    assert len(shown.text.plain) < COLLAPSED.width + 60
    assert shown.chars_hidden == len(raw) - COLLAPSED.width


def test_the_budget_bounds_many_long_lines() -> None:
    raw = "\n".join("y" * 399 for _ in range(10_000))  # each line fits the width, not the budget
    shown = excerpt(raw, COLLAPSED)
    shown_output = sum(line.count("y") for line in shown.text.plain.split("\n"))
    assert shown_output <= COLLAPSED.budget
    assert shown.lines_hidden >= 10_000 - 16


# --- untrusted text ------------------------------------------------------------------------------


def test_markup_and_escapes_are_shown_literally() -> None:
    raw = "[bold red]x[/] \x1b[31mred\x1b[0m \x07 \u202e bidi \udcff"
    shown = excerpt(raw, COLLAPSED)
    assert shown.text.plain == "[bold red]x[/] ␛[31mred␛[0m ␇ \\u202e bidi \\udcff"
    assert not shown.text.spans  # nothing parsed as markup
    assert output_lines(raw) == [shown.text.plain]


def test_a_cut_never_splits_an_escape_stand_in() -> None:
    raw = "\x1b" * 1000  # every character becomes ␛; a cut line still holds only whole stand-ins
    shown = excerpt(raw, Window(head=1, tail=0, width=10, budget=100))
    assert shown.text.plain == "␛" * 8 + " … 990 characters hidden … " + "␛" * 2


# --- cost ----------------------------------------------------------------------------------------


def _collapse_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    real = tool_output.collapse_frames

    def counting(line: str) -> str:
        sizes.append(len(line))
        return real(line)

    monkeypatch.setattr(tool_output, "collapse_frames", counting)
    return sizes


def test_only_the_shown_lines_are_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The excerpt reads a shown line at a time: 100x more lines, the same lines touched."""
    sizes = _collapse_calls(monkeypatch)
    excerpt(numbered(500), COLLAPSED)
    small = (len(sizes), sum(sizes))
    sizes.clear()
    excerpt(numbered(50_000), COLLAPSED)
    assert len(sizes) == small[0] == 16
    assert sum(sizes) <= 2 * small[1]


def test_output_size_does_not_grow_with_the_input() -> None:
    small = excerpt("z" * 10_000 + "\n" + numbered(1000), COLLAPSED)
    large = excerpt("z" * 2_000_000 + "\n" + numbered(100_000), COLLAPSED)
    assert len(large.text.plain) <= 2 * len(small.text.plain)


def test_frames_shrinking_then_growing_collapse_correctly() -> None:
    """The worst order for the overwrite: every later frame shorter than the one before."""
    for n in (10, 1000):
        raw = "\r".join("#" * (n - i) for i in range(n))
        assert collapse_frames(raw) == "#" * n
    assert collapse_frames("\r".join(["long frame", "mid", "x"])) == "xidg frame"


def test_output_lines_collapses_each_line_at_most_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _collapse_calls(monkeypatch)
    assert len(output_lines(numbered(50_000))) == 50_000
    assert sizes == []  # no \r anywhere: no line is collapsed
    assert output_lines(numbered(1000) + "\rtail") == [f"line {i}" for i in range(999)] + ["tail 999"]
    assert len(sizes) == 1000 and sum(sizes) == len(numbered(1000) + "\rtail") - 999
    assert output_lines("") == []


def test_one_line_hidden_reads_as_one_line() -> None:
    assert count_lines(1) == "1 line" and count_lines(50_000) == "50,000 lines"
    assert "… 1 line hidden …" in excerpt(numbered(17), COLLAPSED).text.plain


@pytest.mark.parametrize("raw", ["", "\n", "a", "a\n", "a\n\n", "a\n\nb", "x\ty\r\nz\n", "\n\n\n", "p 1\rp 2\nq"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_chunks_join_to_the_whole_lines(raw: str, chunk: int) -> None:
    assert [line for piece in output_chunks(raw, chunk) for line in piece] == output_lines(raw)


def test_a_big_output_is_read_in_bounded_pieces() -> None:
    """The pager reads between event-loop turns: many lines come in many small pieces,
    each about CHUNK_CHARS, and a 2 MB line (which cannot be split) in one."""
    raw = "\n".join([numbered(50_000)] * 8)  # 400,000 short lines, about 4.3 MB
    pieces = list(output_chunks(raw))
    assert len(pieces) >= len(raw) // (2 * CHUNK_CHARS)
    assert max(sum(len(line) + 1 for line in piece) for piece in pieces) <= CHUNK_CHARS + 200
    assert [len(p) for p in output_chunks("z" * 2_000_000)] == [1]


def test_output_lines_expands_tabs_for_the_pager() -> None:
    assert output_lines("a\tb\n\tc") == ["a       b", "        c"]
