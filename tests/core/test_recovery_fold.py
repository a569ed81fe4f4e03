"""A thread's diagnosis from skeletons read a piece at a time is its diagnosis from its messages.

Opening a thread diagnoses it without holding its messages (issue 10): each stored row is
read as a skeleton (``core.recovery_skeleton``), chunk by chunk, into a fold
(``core.recovery_fold.HistoryFold``). These properties are what makes that exact: on
generated histories as any writer might leave them (``tests.helpers.histories``), on rows
of every shape JSON can hold, and on the threads the real cubeloop writes and kills.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.checkpoint import codec
from core.checkpoint.base import JournalEntry, RunRecord
from core.checkpoint.pages import read_rows
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import CorruptRecordError
from core.messages import AnyMessage, AssistantMessage, TextContent, ToolResultMessage, Usage, user_text
from core.outline import ThreadOutline, read_outline, usage_of
from core.owners import UNOWNED
from core.recovery import JOURNALED_KEY, Diagnosis, diagnose, diagnosis_of
from core.recovery_fold import HistoryFold
from core.recovery_skeleton import SkeletonReader, skeleton
from tests.helpers.crashpoint_verdicts import THREADS
from tests.helpers.histories import histories

READER = SkeletonReader()


def _same(a: Diagnosis, b: Diagnosis) -> None:
    assert a == b
    assert a.repairs == b.repairs  # not compared by Diagnosis.__eq__, and the view words them


def _chunks(draw: st.DrawFn, items: list[Any]) -> list[list[Any]]:
    cuts = sorted(draw(st.lists(st.integers(0, len(items)), max_size=6)))
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def _threads(
    draw: st.DrawFn,
) -> tuple[list[AnyMessage], list[RunRecord], dict[str, JournalEntry] | None, list[list[int]]]:
    """A history, its runs (some completed), a journal or none, and how to cut it in pieces."""
    history = draw(histories())
    for message in history:
        if isinstance(message, AssistantMessage) and draw(st.booleans()):
            message.metadata[JOURNALED_KEY] = True
    runs = [RunRecord(r, 1.0, 2.0 if draw(st.booleans()) else None) for r in ("r1", "r2")]
    journal = None
    if draw(st.booleans()):
        calls = [c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls]
        started = draw(st.lists(st.sampled_from(calls), unique=True)) if calls else []
        journal = {c: JournalEntry(c, "tool", 10.0, 11.0 if draw(st.booleans()) else None) for c in started}
    pieces = _chunks(draw, list(range(len(history))))
    return history, runs, journal, pieces


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_threads(), st.booleans())
def test_skeletons_fed_in_pieces_diagnose_as_the_messages_do(thread: Any, tail: bool) -> None:
    history, runs, journal, pieces = thread
    whole = diagnose(history, runs, journal, tail_only=tail)
    fold = HistoryFold(tail=tail)
    for piece in pieces:
        fold.add([skeleton(history[i]) for i in piece])
    _same(diagnosis_of(fold, runs, journal), whole)
    compact = HistoryFold(tail=tail, compact=True)
    for piece in pieces:
        compact.add([history[i] for i in piece])
    _same(diagnosis_of(compact, runs, journal), whole)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_a_row_read_as_a_skeleton_is_the_skeleton_of_its_message(history: list[AnyMessage]) -> None:
    for message in history:
        raw = codec.encode(message)
        decoded = codec.decode(raw)
        assert READER.read_json(raw) == skeleton(decoded)
        assert READER.read_value(json.loads(raw)) == skeleton(decoded)
        assert skeleton(skeleton(decoded)) == skeleton(decoded)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.sampled_from(["", " ", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "text", "id"]), inner, max_size=3)
    ),
    max_leaves=6,
)
_FIELDS = {
    "role": st.sampled_from(["user", "assistant", "tool_result", "system", 3]),
    "content": st.one_of(
        _JSON,
        st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "image", "tool_call", "thinking", "x"])},
                optional={
                    "text": _JSON,
                    "id": _JSON,
                    "name": _JSON,
                    "arguments": _JSON,
                    "data": _JSON,
                    "mime_type": _JSON,
                    "source": _JSON,
                    "media_type": _JSON,
                },
            ),
            max_size=3,
        ),
    ),
    "tool_call_id": _JSON,
    "stop_reason": _JSON,
    "error_message": _JSON,
    "run_id": _JSON,
    "timestamp": _JSON,
    "metadata": _JSON,
    "usage": st.one_of(_JSON, st.fixed_dictionaries({}, optional={"input_tokens": _JSON, "output_tokens": _JSON})),
    "is_error": _JSON,
}


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.fixed_dictionaries({}, optional=_FIELDS), _JSON), st.booleans())
def test_a_row_is_readable_as_a_skeleton_exactly_when_it_decodes(value: Any, truncate: bool) -> None:
    """Whatever a row holds - valid JSON of the wrong shape, a truncated text - the
    streamed read gives the same verdict as ``load``: unreadable, or its message's skeleton."""
    raw = json.dumps(value)
    if truncate:
        raw = raw[:-1]

    def decode(rows: Any) -> Any:
        ((row_id, text),) = rows
        try:
            return [codec.decode(text, row_id=row_id)], [row_id], []
        except CorruptRecordError as error:
            from core.checkpoint.base import CorruptRow

            return [], [], [CorruptRow(row_id, str(error), text)]

    items, ids, problems = read_rows([(7, raw)], READER, decode)
    try:
        message = codec.decode(raw, row_id=7)
    except CorruptRecordError as error:
        assert (items, ids) == ([], []) and [p.reason for p in problems] == [str(error)]
    else:
        assert items == [skeleton(message)] and ids == [7] and problems == []


def test_lone_surrogates_the_fast_path_refuses_are_decoded_by_the_store() -> None:
    odd = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
    message = ToolResultMessage(tool_call_id="c1", content=[TextContent(text=odd)], run_id="r")
    raw = codec.encode(message)
    decoded: list[Any] = []

    def decode(rows: Any) -> Any:
        decoded.extend(rows)
        return [codec.decode(rows[0][1])], [rows[0][0]], []

    items, ids, problems = read_rows([(1, raw)], READER, decode)
    assert items == [skeleton(message)] and ids == [1] and problems == []
    assert decoded == [(1, raw)], "only the row the reader refused was decoded"


def test_the_outline_sums_the_usage_of_every_reply() -> None:
    replies = [
        AssistantMessage(
            content=[TextContent(text="a")], usage=Usage(input_tokens=3, output_tokens=2, cache_read_tokens=1)
        ),
        AssistantMessage(content=[TextContent(text="b")]),
        AssistantMessage(content=[TextContent(text="c")], usage=Usage(input_tokens=4, cache_write_tokens=5)),
    ]
    outline = ThreadOutline()
    outline.add([user_text("q"), *replies])
    assert (
        outline.totals
        == usage_of(replies)
        == Usage(input_tokens=7, output_tokens=2, cache_read_tokens=1, cache_write_tokens=5)
    )


async def test_cubeloop_threads_stream_into_the_diagnosis_load_gives(fixture_db: Path) -> None:
    async with await SQLiteCheckpointer.open(fixture_db, create=False, owner=UNOWNED) as store:
        for thread in THREADS:
            data = await store.load(thread["thread_id"])
            found = await read_outline(store, thread["thread_id"])
            assert data is not None and found is not None
            rest, outline = found
            assert rest.messages == [] and outline.count == len(data.messages)
            _same(
                outline.diagnosis(rest.runs, rest.journal, problems=rest.problems), diagnose(data.messages, data.runs)
            )
            assert outline.totals == usage_of(data.messages)
