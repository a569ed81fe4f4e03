"""The records of paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`).

A thread view shows a thread's newest messages and pages earlier ones in as the user
scrolls (issue 10: "the view decodes what it shows plus what diagnosis needs"), so a
store hands a thread over two ways besides ``load``: a :class:`MessagePage` of rows
counted back from a row id, and every row once, decoded a chunk at a time into a
:data:`RowSink` and not kept. Shared by every backend's page module
(``sqlite_pages``, ``postgres_pages``, ``redis_pages``, ``memory_pages``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.checkpoint.base import CorruptRow
from core.messages import AnyMessage

READ_CHUNK = 500
"""Rows a streamed read decodes and hands over at a time: the most of them it holds at
once (500 rows of a typical agent thread are ~0.2 MB of text, ~1.3 MB decoded)."""

RowSink = Callable[[Sequence[AnyMessage], Sequence[Any], Sequence[CorruptRow]], None]
"""Told ``(messages, message_ids, problems)`` for each chunk of a streamed read, in row
order: the chunk's decoded messages with their row ids, and its undecodable rows."""


@dataclass(frozen=True, slots=True)
class MessagePage:
    """Consecutive stored rows of one thread, in row order: ``messages`` with their row ids
    ``message_ids``, and the rows among them that could not be decoded (``problems``,
    kept as they are). ``earlier`` counts the thread's rows stored before the page's first
    row (0: the page starts the thread). Empty for a thread that is missing or another
    owner's."""

    messages: list[AnyMessage] = field(default_factory=list)
    message_ids: list[Any] = field(default_factory=list)
    problems: list[CorruptRow] = field(default_factory=list)
    earlier: int = 0

    @property
    def first_id(self) -> Any | None:
        """The lowest row id in the page (a message's or an undecodable row's): the
        ``before`` of the page before it. ``None`` for an empty page."""
        ids = self.message_ids[:1] + [p.row_id for p in self.problems[:1]]
        return min(ids) if ids else None

    @property
    def last_id(self) -> Any | None:
        """The highest row id in the page, ``None`` for an empty page."""
        ids = self.message_ids[-1:] + [p.row_id for p in self.problems[-1:]]
        return max(ids) if ids else None

    @property
    def rows(self) -> int:
        """How many rows the page holds (messages and undecodable rows)."""
        return len(self.messages) + len(self.problems)


def check_limit(limit: int) -> None:
    """Raise ``ValueError`` (one sentence) unless ``limit`` is a positive row count."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"A page holds at least one row; {limit!r} rows were asked for.")
