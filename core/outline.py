"""A thread's outline: what opening it needs of all of its rows, read once and kept small.

Opening a thread shows its newest messages (a page, :meth:`PagedReads.load_page
<core.checkpoint.capabilities.PagedReads.load_page>`), but its banner, its resume plan
and its token totals are of the whole thread (issue 10). :class:`ThreadOutline` is the
sink of a streamed read (:meth:`~core.checkpoint.capabilities.PagedReads.load_streamed`):
each chunk of decoded rows goes in and is dropped, and what stays is the diagnosis's fold
(:class:`~core.recovery_fold.HistoryFold` with skeletons), the count of messages, the usage
totals, the ids of the calls that have results and the undecodable rows. The rows are read
as skeletons (:class:`~core.recovery_skeleton.SkeletonReader`): no message of the thread is
decoded whole for its outline. Messages a
follower reads later go in the same way (:meth:`ThreadOutline.add`), so the diagnosis and
the totals stay those of the whole thread without reading it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from core.checkpoint.base import CheckpointData, Checkpointer, CorruptRow, JournalEntry, PendingRequest, RunRecord
from core.checkpoint.capabilities import PagedReads, supports
from core.checkpoint.pages import RowReader
from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, Usage
from core.recovery import Diagnosis, diagnosis_of
from core.recovery_fold import HistoryFold
from core.recovery_skeleton import SkeletonReader, skeleton

_READER = SkeletonReader()


class ThreadOutline:
    """The outline of one thread, fed its rows in row order; see the module docstring.

    A streamed read feeds it skeletons (``store.load_streamed(thread_id, outline,
    reader=outline.reader)``, the :data:`~core.checkpoint.pages.RowSink` shape); :meth:`add`
    takes whole messages read later. Not safe for two threads at once; a store may feed it
    on its own thread (SQLite), after which only the caller uses it. Memory: the fold's
    (see :class:`~core.recovery_fold.HistoryFold`) plus one id per answered tool call and
    the undecodable rows as stored.
    """

    __slots__ = ("answered", "fold", "last_id", "problems", "totals")

    reader: RowReader = _READER
    """What a streamed read makes of each row for it: its skeleton, never its message."""

    def __init__(self) -> None:
        self.fold = HistoryFold()
        """The diagnosis's reading of every message fed (as skeletons)."""
        self.totals = Usage()
        """Token usage summed over every assistant message fed (tokens)."""
        self.answered: set[str] = set()
        """Ids of the tool calls that have a result among the messages fed."""
        self.problems: list[CorruptRow] = []
        """The undecodable message rows fed, in row order."""
        self.last_id: Any = None
        """The highest row id fed (a message's or an undecodable row's), ``None`` before any."""

    def __call__(self, skeletons: Sequence[AnyMessage], ids: Sequence[Any], problems: Sequence[CorruptRow]) -> None:
        """Take one chunk of a streamed read made with :attr:`reader`: the skeletons of its
        readable rows, their ids, its undecodable rows."""
        self._take(skeletons)
        self._rows(ids, problems)

    def add_rows(self, messages: Sequence[AnyMessage], ids: Sequence[Any], problems: Sequence[CorruptRow]) -> None:
        """Take the next rows of the thread, decoded (what a follower reads later: messages,
        their ids, undecodable rows); only their skeletons are kept."""
        self.add(messages)
        self._rows(ids, problems)

    def add(self, messages: Iterable[AnyMessage]) -> None:
        """Take the next messages of the thread (row order); only their skeletons are kept."""
        self._take([skeleton(m) for m in messages])

    def _rows(self, ids: Sequence[Any], problems: Sequence[CorruptRow]) -> None:
        self.problems.extend(problems)
        for row_id in list(ids[-1:]) + [p.row_id for p in problems[-1:]]:
            if self.last_id is None or row_id > self.last_id:
                self.last_id = row_id

    def _take(self, skeletons: Sequence[AnyMessage]) -> None:
        totals, answered = self.totals, self.answered
        for message in skeletons:
            if isinstance(message, AssistantMessage):
                add_usage(totals, message.usage)
            elif isinstance(message, ToolResultMessage):
                answered.add(message.tool_call_id)
        self.fold.add(skeletons)

    @property
    def count(self) -> int:
        """How many messages were fed (undecodable rows not counted)."""
        return self.fold.count

    def diagnosis(
        self,
        runs: Iterable[RunRecord] = (),
        journal: Mapping[str, JournalEntry] | None = None,
        *,
        problems: Sequence[CorruptRow] = (),
        pending: PendingRequest | None = None,
    ) -> Diagnosis:
        """:func:`core.recovery.diagnose` of every message fed, as if they had been loaded
        whole; ``problems`` are the thread's problems beyond the undecodable rows fed (an
        unreadable extra or record). Cost grows with the open part of the thread only."""
        return diagnosis_of(self.fold, runs, journal, problems=[*self.problems, *problems], pending=pending)


def add_usage(total: Usage, usage: Usage | None) -> None:
    """Add one model call's ``usage`` (tokens; ``None``: none reported) to ``total``, in place."""
    if usage is not None:
        total.input_tokens += usage.input_tokens
        total.output_tokens += usage.output_tokens
        total.cache_read_tokens += usage.cache_read_tokens
        total.cache_write_tokens += usage.cache_write_tokens


def usage_of(messages: Iterable[AnyMessage]) -> Usage:
    """The token usage summed over the assistant messages among ``messages`` (tokens)."""
    total = Usage()
    for message in messages:
        if isinstance(message, AssistantMessage):
            add_usage(total, message.usage)
    return total


async def read_outline(
    store: Checkpointer, thread_id: str, *, upto: Any = None
) -> tuple[CheckpointData, ThreadOutline] | None:
    """Read ``thread_id`` whole into a new :class:`ThreadOutline`, never holding its messages
    (:meth:`PagedReads.load_streamed <core.checkpoint.capabilities.PagedReads.load_streamed>`;
    a store without it is loaded and its messages dropped). Returns the thread's other data
    (runs, journal, pending request, extra, and the problems that are not message rows; no
    messages) and the outline, or ``None`` for a thread the store does not have. ``upto``:
    only rows with ids up to it (with a store without streamed reads, ids compared as stored).
    Raises the store's errors."""
    outline = ThreadOutline()
    if supports(store, PagedReads):
        data = await store.load_streamed(thread_id, outline, upto=upto, reader=outline.reader)
        return None if data is None else (data, outline)
    loaded = await store.load(thread_id)
    if loaded is None:
        return None
    kept = [i for i, row_id in enumerate(loaded.message_ids) if upto is None or row_id <= upto]
    row_problems = [p for p in loaded.problems if isinstance(p.row_id, int) and (upto is None or p.row_id <= upto)]
    outline.add_rows([loaded.messages[i] for i in kept], [loaded.message_ids[i] for i in kept], row_problems)
    loaded.problems = [p for p in loaded.problems if not isinstance(p.row_id, int)]
    loaded.messages, loaded.message_ids = [], []
    return loaded, outline
