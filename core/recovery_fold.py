"""A thread's history read once, a piece at a time, keeping only what a diagnosis reads.

:func:`core.recovery.diagnose` classifies a whole stored thread. Reading a long thread
whole - every message decoded and held at once - costs memory that grows with its
length (issue 10: 453 MB with a 100,000-message thread open). :class:`HistoryFold` is the
same reading done as a fold: the messages go in, in append order, in pieces of any size
(a store's chunks), and what remains is the request builder's state
(:class:`core.request.RequestBuilder`, keeping only the open part of the request) plus a
few counts and indices. :func:`core.recovery.diagnose` itself is this fold over the list
it is given, so there is one reading of a history, whichever way it arrives.

With ``compact=True`` each message is first cut down to its skeleton
(:func:`core.recovery_skeleton.skeleton`), and skeletons read straight from stored rows
(:class:`core.recovery_skeleton.SkeletonReader`) may be fed as they are: whatever the fold
keeps (the open calls and what follows them, the last reply) is then kept small too.
Exactness rests on facts checked by ``tests/core/test_recovery_fold.py`` on generated
histories (hypothesis) and on the threads the real cubeloop writes: the builder reads
nothing a skeleton drops, and feeding pieces is feeding the whole.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable

from core.messages import AnyMessage, AssistantMessage, ToolResultMessage, UnknownMessage, UserMessage
from core.recovery_skeleton import skeleton
from core.request import BuiltRequest, RequestBuilder


class HistoryFold:
    """A thread's stored history read in append order, in pieces; see the module docstring.

    Feed it with :meth:`add` (any number of times); read :meth:`built` and the counts at
    any point (reading changes nothing, feeding may go on). ``tail=True`` reads the tail of
    a longer thread (:class:`core.request.RequestBuilder`'s ``tail``); ``compact=True``
    keeps :func:`skeleton` of each message instead of the message. Indices are positions
    in the history fed (0-based). Memory: the builder's open part and the messages after
    the last assistant message, plus 8 bytes per user message and per assistant message.
    """

    __slots__ = (
        "_after_results",
        "_assistants",
        "_builder",
        "_compact",
        "_last",
        "_user_after",
        "_users",
        "count",
        "last_known",
        "tail",
        "unknown",
    )

    def __init__(self, *, tail: bool = False, compact: bool = False) -> None:
        self._builder = RequestBuilder(tail=tail, keep_request=False)
        self._compact = compact
        self.tail = tail
        """Whether the history is the tail of a longer thread."""
        self.count = 0
        """How many messages were fed."""
        self.unknown = 0
        """How many of them are of a role this version does not know."""
        self.last_known = -1
        """The index of the last message of a known role (-1: none)."""
        self._last: tuple[int, AssistantMessage] | None = None
        self._users = array("q")
        self._assistants = array("q")
        self._after_results: list[int] = []  # tool results stored after the last assistant message
        self._user_after = False

    def add(self, messages: Iterable[AnyMessage]) -> None:
        """Read ``messages``, the next messages of the history (append order)."""
        kept: list[AnyMessage] = []
        i = self.count
        for message in messages:
            if self._compact:
                message = skeleton(message)
            kept.append(message)
            if isinstance(message, UnknownMessage):
                self.unknown += 1
            else:
                self.last_known = i
                if isinstance(message, AssistantMessage):
                    self._assistants.append(i)
                    self._last = (i, message)
                    self._after_results.clear()
                    self._user_after = False
                elif isinstance(message, UserMessage):
                    self._users.append(i)
                    self._user_after = True
                elif isinstance(message, ToolResultMessage):
                    self._after_results.append(i)
            i += 1
        self.count = i
        self._builder.extend(kept)

    def built(self) -> BuiltRequest:
        """The request builder's findings (``messages`` holds at most the open part and one
        message before it: see ``RequestBuilder(keep_request=False)``)."""
        return self._builder.built()

    @property
    def last_assistant(self) -> tuple[int, AssistantMessage] | None:
        """The last assistant message and its index (its skeleton when compact), or ``None``."""
        return self._last

    @property
    def user_after_last_assistant(self) -> bool:
        """Whether a user message was stored after the last assistant message (or, with no
        assistant message, at all)."""
        return self._user_after

    @property
    def results_after_last_assistant(self) -> list[int]:
        """Indices of the tool results stored after the last assistant message (all of them
        when there is none), in order."""
        return list(self._after_results)

    def users_after(self, index: int) -> int:
        """How many user messages were stored after ``index``."""
        return len(self._users) - bisect.bisect_right(self._users, index)

    def replies_after(self, index: int) -> int:
        """How many assistant messages were stored after ``index``."""
        return len(self._assistants) - bisect.bisect_right(self._assistants, index)
