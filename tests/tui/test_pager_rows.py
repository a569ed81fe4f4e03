"""The pager's pure parts: rows of wrapped lines, the search pattern, finding the next match."""

from __future__ import annotations

from tui.screens.pager import OutputView, Rows, search_pattern


def _rows(lines: list[str], width: int) -> Rows:
    rows = Rows()
    rows.add(lines, 0, width)
    return rows


def test_short_lines_take_one_row_each_and_long_ones_wrap() -> None:
    lines = ["a" * 5, "b" * 25, "", "c" * 10]
    rows = _rows(lines, 10)
    assert list(rows.line) == [0, 1, 1, 1, 2, 3]
    assert list(rows.start) == [0, 0, 10, 20, 0, 0]
    assert list(rows.first) == [0, 1, 4, 5]
    assert [rows.end(r, lines[rows.line[r]]) for r in range(len(rows))] == [5, 10, 20, 25, 0, 10]


def test_wide_characters_wrap_by_cells_and_never_split() -> None:
    rows = _rows(["日本語テキスト"], 5)  # seven characters of two cells each: two per row of five cells
    assert list(rows.start) == [0, 2, 4, 6]


def test_rows_added_in_pieces_equal_rows_added_at_once() -> None:
    lines = [f"line {i}" + "x" * (i % 30) for i in range(200)]
    whole = _rows(lines, 12)
    pieces = Rows()
    for start in range(0, 200, 37):
        pieces.add(lines[start : start + 37], start, 12)
    assert (list(pieces.line), list(pieces.start), list(pieces.first)) == (
        list(whole.line),
        list(whole.start),
        list(whole.first),
    )


def test_smart_case() -> None:
    assert search_pattern("error").search("An ERROR here")
    assert not search_pattern("Error").search("an error here")
    assert search_pattern("a.b[").search("x a.b[ y") and not search_pattern("a.b").search("axb")  # literal


def _view(lines: list[str], query: str) -> OutputView:
    view = OutputView("")
    view.lines = lines
    view.pattern = search_pattern(query)
    return view


def test_find_forward_backward_and_round_the_ends() -> None:
    view = _view(["x hit", "none", "hit hit", "end"], "hit")
    assert view.find(0, -1) == ((0, 2, 5), False)  # from the very top: the first match
    assert view.find(0, 2) == ((2, 0, 3), False)  # after the first: the next line's
    assert view.find(2, 0) == ((2, 4, 7), False)  # the second on the same line
    assert view.find(2, 4) == ((0, 2, 5), True)  # past the last: round to the first
    assert view.find(2, 4, forward=False) == ((2, 0, 3), False)
    assert view.find(2, 0, forward=False) == ((0, 2, 5), False)
    assert view.find(0, 2, forward=False) == ((2, 4, 7), True)  # before the first: round to the last


def test_a_single_match_is_found_again_from_itself() -> None:
    view = _view(["one", "only hit", "two"], "hit")
    assert view.find(1, 5) == ((1, 5, 8), True)
    assert view.find(1, 5, forward=False) == ((1, 5, 8), True)


def test_nothing_to_find() -> None:
    assert _view(["abc"], "zzz").find(0, -1) == (None, False)
    assert _view([], "a").find(0, -1) == (None, False)
    assert _view(["a a a"], "a").count_matches() == 3
