"""The records of paged and streamed reads (:class:`~core.checkpoint.capabilities.PagedReads`).

A thread view shows a thread's newest messages and pages earlier ones in as the user
scrolls (issue 10: "the view decodes what it shows plus what diagnosis needs"), so a
store hands a thread over two ways besides ``load``: a :class:`MessagePage` of rows
counted back from a row id, and every row once, read a chunk at a time into a
:data:`RowSink` (decoded, or only what a :class:`RowReader` reads of it) and not kept. Shared by every backend's page module
(``sqlite_pages``, ``postgres_pages``, ``redis_pages``, ``memory_pages``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.checkpoint.base import CorruptRow
from core.errors import CorruptRecordError
from core.messages import AnyMessage

READ_CHUNK = 500
"""Rows a streamed read decodes and hands over at a time: the most of them it holds at
once (500 rows of a typical agent thread are ~0.2 MB of text, ~1.3 MB decoded)."""

RowSink = Callable[[Sequence[Any], Sequence[Any], Sequence[CorruptRow]], None]
"""Told ``(items, message_ids, problems)`` for each chunk of a streamed read, in row order:
what each readable row was read as (its message, or what the read's :class:`RowReader`
made of it) with its row id, and the chunk's undecodable rows."""


class RowReader(Protocol):
    """What a streamed read makes of each stored row instead of decoding its message (a
    thread's outline keeps skeletons: :class:`core.recovery_skeleton.SkeletonReader`).

    A reader must accept exactly the rows the store's decoder accepts, or fewer: a row it
    refuses (``ValueError``) is decoded by the store, then given to :meth:`read_message`,
    or reported as undecodable in the store's own words (:func:`read_rows`)."""

    def read_json(self, raw: str | bytes) -> Any:
        """What the row stored as JSON text ``raw`` is read as; ``ValueError`` if it cannot say."""
        ...

    def read_value(self, value: Any) -> Any:
        """What the row stored as the parsed wire ``value`` (a dict) is read as; ``ValueError`` likewise."""
        ...

    def read_message(self, message: AnyMessage) -> Any:
        """What a row the store decoded into ``message`` is read as."""
        ...


Decoded = tuple[list[AnyMessage], list[Any], list[CorruptRow]]
"""A backend's decoding of some rows: messages, their row ids, undecodable rows."""


def read_rows(
    rows: Sequence[tuple[Any, Any]],
    reader: RowReader | None,
    decode: Callable[[Sequence[tuple[Any, Any]]], Decoded],
    read: Callable[[Any], Any] | None = None,
) -> tuple[list[Any], list[Any], list[CorruptRow]]:
    """``(row id, wire)`` rows as a streamed read hands them over: decoded by the backend's
    ``decode`` when there is no ``reader``; else each through the reader (``read(wire)``,
    by default ``reader.read_json``: ``wire`` is JSON text), and the rows it refuses
    (``ValueError``, or the ``CorruptRecordError`` of a ``read`` that unpacks the row first)
    through ``decode``, whose messages then go to ``reader.read_message``. Row order is kept."""
    if reader is None:
        return decode(rows)
    read = read or reader.read_json
    items: list[Any] = []
    ids: list[Any] = []
    problems: list[CorruptRow] = []
    for row in rows:
        try:
            item = read(row[1])
        except (ValueError, CorruptRecordError):
            messages, good, bad = decode([row])
            items += [reader.read_message(m) for m in messages]
            ids += good
            problems += bad
        else:
            items.append(item)
            ids.append(row[0])
    return items, ids, problems


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
