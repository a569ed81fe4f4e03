"""What a session is started with: fixed once the CLI (or a test) has built it.

The session's runtime state (agents, runs, followers, the store once open, what the
connection says now) lives in :class:`tui.session.Session` and changes only through its
verbs; this configuration never changes while the app runs, so a screen can read it
without asking whether it moved.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from core.checkpoint.base import Checkpointer
from tui.attention import Alerts

StoreOpener = Callable[[], Awaitable[Checkpointer]]
"""Opens the database; raises ``DatabaseOpenError`` with one sentence when it cannot."""

ProviderFactory = Callable[[], Any]
"""Builds the model provider; may raise ``MissingApiKeyError`` (then runs are disabled)."""

INPUT_QUIET = 0.5
"""Seconds without a key or mouse event (``Session.note_input``) before the picker's
rows are refined from whole threads again: that refinement reads thread after thread in
the store's thread (at 10,000 threads 4-7 s of one core after the first listing, 365-740 µs
a thread here by load), and a key handled meanwhile shares the GIL with it: the help key's p95 was
53-130 ms then, 17-30 ms once it was done (issue 10). Half a second: a pause in typing."""


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What the session was started with; assigning a field raises
    ``dataclasses.FrozenInstanceError``, and ``agent_options`` is a read-only mapping
    (item assignment raises ``TypeError``).

    ``open_store`` opens the database (for ``opens_for``), ``make_provider`` builds the
    model provider when first needed. ``location`` names the database in sentences
    ("~/.local/share/.../threads.sqlite", "memory" for a store handed in ready); ``model``
    is shown in the status bar ("demo", "custom" or the model's name). ``tools`` and
    ``system_prompt`` are given to every ``Agent``, ``agent_options`` as keywords too
    (e.g. ``workflow``, ``approvals``, ``abort_grace``).
    """

    open_store: StoreOpener
    make_provider: ProviderFactory
    location: str = ""
    model: str = ""
    tools: Sequence[Any] = ()
    """Stored as a tuple, whatever sequence was given."""
    system_prompt: str = ""
    agent_options: Mapping[str, Any] = field(default_factory=dict)
    """Stored as a read-only copy of the mapping given."""
    alerts: Alerts = field(default_factory=Alerts)
    """Whether the bell rings and a notice shows when a thread starts waiting for an answer
    or crashes (``--no-bell``, ``--no-notices``)."""
    opens_for: str | None = None
    """The owner ``open_store`` opens the store for, so the screens can name it before the
    store is open (``None``: not known until then); ``Session.owner`` is the store's own word."""
    input_quiet: float = INPUT_QUIET
    """Seconds after the last input (``Session.note_input``) before whole-thread refinement goes on."""

    def __post_init__(self) -> None:
        # Copies, so a caller keeping the list or dict it passed cannot change a frozen config.
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "agent_options", MappingProxyType(dict(self.agent_options)))
