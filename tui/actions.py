"""Every key of the app in one table: per screen, each action's id, default keys, footer
label, tooltip, help text and availability rule.

The screens' ``BINDINGS`` (:func:`bindings`), their ``check_action`` and "why not" notices
(:func:`thread_availability`, :func:`picker_availability`: each row's :attr:`Action.rule`),
the help screen (:mod:`tui.screens.modals`), the footer's choice of keys on a narrow
terminal (:data:`RANKS`, :data:`SHORT`) and the user's keymap file (:mod:`tui.keymap`,
which names actions by :attr:`Action.id`) are all derived from here.

Keys are Textual's names (``"a"``, ``"slash"``, ``"ctrl+a"``); a keymap replaces an
action's keys through Textual's own mechanism (``App.set_keymap``), and :func:`key_names`
says which keys an action has now, so help and notices name the keys as remapped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from textual.binding import Binding
from textual.keys import format_key

from core.recovery import ThreadState
from tui.text import clean

if TYPE_CHECKING:
    from textual.app import App
    from textual.dom import DOMNode

    from core.checkpoint.base import PendingRequest
    from core.lease_status import LeaseView
    from core.recovery import Diagnosis
    from tui.tool_output import Excerpt

Availability = tuple[bool | None, str | None]
"""``(enabled, why_not)``: ``enabled`` as Textual's ``check_action`` takes it (``True``
enabled; ``None`` shown dimmed; ``False`` hidden from the footer), and the one sentence a
press of a key that does nothing says (``None``: nothing to say)."""

KeyName = Callable[[str], str]
"""The keys bound now to an action, by its :attr:`Action.id`, as the help writes them (``"n"``)."""

ENABLED: Availability = (True, None)

UNRANKED = 5
"""The footer rank of a key that names none (:attr:`Action.rank`): after every ranked one."""


F = TypeVar("F", contravariant=True)
"""What an action's availability rule reads (the screen, through a protocol of its facts)."""

Rule = Callable[[F, KeyName], Availability]
"""An availability rule: the facts of its screen and the keys now → :data:`Availability`."""


@dataclass(frozen=True)
class Action(Generic[F]):
    """One action of one screen (or of the app, on every screen), with its availability
    rule reading that screen's facts ``F``."""

    id: str
    """The binding id a keymap names: ``"thread.abort"`` (screen prefix, dot, action)."""
    name: str
    """The action as Textual calls it (``"abort"`` runs ``action_abort``; may hold arguments)."""
    keys: str
    """Default keys, Textual's names, comma-separated (``"a"``, ``"slash"``)."""
    description: str
    """The footer's label."""
    tooltip: str
    """The footer's tooltip."""
    help: str | None = None
    """The help screen's line; ``{other.id}`` is replaced by that action's keys now. ``None``:
    not listed on its own (it is named in another action's line, see :attr:`help_with`)."""
    help_with: tuple[str, ...] = ()
    """Ids of actions whose keys join this one's in the help's key column (``c E D``)."""
    show: bool = True
    """Whether the footer shows it (when it is available)."""
    rank: int = UNRANKED
    """Footer priority on a narrow terminal: lower ranks are kept first (``0`` always);
    :data:`UNRANKED` by default."""
    short: str | None = None
    """A shorter footer label, used when the full ones do not fit."""
    priority: bool = False
    """Textual's priority binding (checked before the focused widget's)."""
    rule: Rule[F] | None = None
    """When the action is available and why not (``None``: always)."""

    def availability(self, facts: F, key: KeyName) -> Availability:
        """Whether this action is available with ``facts``, and if not why, naming keys by
        ``key`` (an action id → its keys now)."""
        return ENABLED if self.rule is None else self.rule(facts, key)

    def binding(self) -> Binding:
        """This action as a Textual :class:`~textual.binding.Binding` with its default keys."""
        return Binding(
            self.keys,
            self.name,
            self.description,
            id=self.id,
            tooltip=self.tooltip,
            show=self.show,
            priority=self.priority,
        )


def bindings(actions: Iterable[Action[Any]]) -> list[Binding]:
    """The ``BINDINGS`` of a screen whose actions are ``actions``."""
    return [action.binding() for action in actions]


# --- availability rules ---------------------------------------------------------------


class ThreadFacts(Protocol):
    """What the thread screen's rules read (:class:`~tui.screens.thread_view.ThreadView`)."""

    loaded: bool
    running: bool
    elsewhere: LeaseView | None
    diagnosis: Diagnosis | None
    pending: PendingRequest | None


class PickerFacts(Protocol):
    """What the picker's rules read (:class:`~tui.screens.threads.ThreadsScreen`)."""

    @property
    def filter_open(self) -> bool:
        """Whether the filter is shown (Escape then clears it)."""
        ...


LOADING = "The thread is still loading."


def _loaded(rule: Rule[ThreadFacts]) -> Rule[ThreadFacts]:
    """``rule`` once the thread is loaded; until then the key is dimmed, "still loading"."""

    def checked(facts: ThreadFacts, key: KeyName) -> Availability:
        return rule(facts, key) if facts.loaded else (None, LOADING)

    return checked


def _active(facts: ThreadFacts) -> bool:
    """Whether a run goes on, here or in another process."""
    return facts.running or facts.elsewhere is not None


def _any_time(facts: ThreadFacts, key: KeyName) -> Availability:
    return ENABLED  # steer, follow-up: when idle they offer a new prompt


def _abort(facts: ThreadFacts, key: KeyName) -> Availability:
    return ENABLED if _active(facts) else (None, "Nothing to abort: the agent is not running on this thread.")


def _stop(facts: ThreadFacts, key: KeyName) -> Availability:
    # Item 5's keys (issue 11) are shown only while they apply, so the footer keeps room for q and ?.
    return ENABLED if _active(facts) else (False, "Nothing to stop: the agent is not running on this thread.")


def _while_running(words: str) -> Rule[ThreadFacts]:
    """Shown only while a run goes on; else a new prompt is the way to send ``words``."""

    def rule(facts: ThreadFacts, key: KeyName) -> Availability:
        sentence = f"The agent is not running: send the {words} as a new prompt with {key('thread.prompt')}."
        return ENABLED if _active(facts) else (False, sentence)

    return rule


def _new_prompt(facts: ThreadFacts, key: KeyName) -> Availability:
    if not facts.running:
        return ENABLED
    return None, (
        f"The agent is running: steer it with {key('thread.steer')}, queue a follow-up with "
        f"{key('thread.follow_up')}, or abort it with {key('thread.abort')}."
    )


def _answer(facts: ThreadFacts, key: KeyName) -> Availability:
    # Hidden from the footer unless a request waits.
    if not facts.loaded:
        return False, LOADING
    if facts.pending is None:
        return False, "Nothing to answer: the thread is not waiting for an answer."
    return ENABLED


def _resume(facts: ThreadFacts, key: KeyName) -> Availability:
    if facts.running:
        return None, "Nothing to resume: the agent is running this thread now."
    if facts.elsewhere is not None:
        return ENABLED  # enabled: action_resume says who runs it
    diagnosis = facts.diagnosis
    if diagnosis is not None and diagnosis.resumable:
        return ENABLED
    prompt = key("thread.prompt")
    state = diagnosis.state if diagnosis is not None else None
    if state is ThreadState.COMPLETED:
        why = f"Nothing to resume: the thread completed; press {prompt} to send a new prompt."
    elif state is ThreadState.ABORTED:
        why = f"Nothing to resume: the run was aborted and saved; press {prompt} to send a new prompt."
    elif state is ThreadState.EMPTY:
        why = f"Nothing to resume: the thread has no messages yet; press {prompt} to send the first prompt."
    elif state is ThreadState.WAITING and diagnosis is not None and diagnosis.pending is not None:
        why = (
            f"Nothing to resume: the thread is waiting for an answer to {clean(diagnosis.pending.question)!r}; "
            f"press {key('thread.answer')} to answer it."
        )
    elif diagnosis is None:
        why = f"Nothing to resume: no run crashed here; press {prompt} to send a new prompt."
    else:
        why = f"Nothing to resume: the thread is {diagnosis.label}; press {prompt} to send a new prompt."
    return None, why


class ToolFacts(Protocol):
    """What a tool call's rules read (:class:`~tui.widgets.tool_call.ToolCallView`)."""

    status: str
    expanded: bool

    @property
    def output(self) -> str:
        """The result's whole text ("" before the result)."""
        ...

    @property
    def shown(self) -> Excerpt | None:
        """What the collapsed result shows (``None`` before the result)."""
        ...


_NO_RESULT_YET = ("streaming", "pending", "running")


def _no_output(facts: ToolFacts, what: str) -> str:
    """Why a call has no output to ``what`` (expand, open in the pager), in one sentence."""
    if facts.status in _NO_RESULT_YET:
        return f"Nothing to {what} yet: the tool is still running, and its output comes with its result."
    if facts.shown is None:
        return f"Nothing to {what}: this call has no result."
    return f"Nothing to {what}: the tool returned no output."


def _expand(facts: ToolFacts, key: KeyName) -> Availability:
    # Hidden from the footer until there is a result worth expanding.
    shown = facts.shown
    if shown is not None and (facts.expanded or not shown.complete):
        return ENABLED
    if shown is not None and facts.output:
        return False, f"Nothing more to show: the whole output is shown already ({key('tool.pager')} opens the pager)."
    return False, _no_output(facts, "expand")


def _pager(facts: ToolFacts, key: KeyName) -> Availability:
    return ENABLED if facts.output else (False, _no_output(facts, "open in the pager"))


def _filter_open(facts: PickerFacts, key: KeyName) -> Availability:
    return facts.filter_open, None  # Escape is only ours while a filter is open


# --- the tables -----------------------------------------------------------------------

APP: tuple[Action[object], ...] = (
    Action(
        "app.help", "help", "question_mark", "Help", "Show keys and what crash points mean", help="this help", rank=0
    ),
    Action("app.quit", "quit", "ctrl+q", "Quit", "Quit cubepi-tui", show=False, priority=True),
)
"""The app's own keys, active on every screen."""

PICKER: tuple[Action[PickerFacts], ...] = (
    Action(
        "threads.open", "open", "enter", "Open", "Open the selected thread", "open the thread under the cursor", rank=1
    ),
    Action(
        "threads.filter",
        "filter",
        "slash",
        "Filter",
        "Filter by thread id, first prompt or state",
        "filter the list as you type: thread id, first prompt or state ({threads.clear_filter} clears it)",
        rank=2,
    ),
    Action(
        "threads.attention",
        "attention",
        "exclamation_mark",
        "Attention",
        "Show only the threads waiting for you, crashed, failed or aborted (again: all)",
        "only the threads that need you: waiting for an answer, crashed, failed or aborted (again: all)",
        rank=2,
    ),
    Action(
        "threads.new",
        "new_thread",
        "n",
        "New thread",
        "Start a new thread with a prompt",
        "start a new thread (asks for the first prompt)",
        rank=1,
    ),
    Action(
        "threads.delete",
        "delete",
        "D",
        "Delete",
        "Delete the selected thread (asks first)",
        "delete the thread under the cursor (asks first; refused while a run holds it)",
        rank=3,
    ),
    Action("threads.reload", "reload", "r", "Reload", "Read the thread list again", "reload the list", rank=4),
    Action("threads.quit", "app.quit", "q", "Quit", "Quit cubepi-tui", "quit", rank=1),
    Action(
        "threads.clear_filter",
        "clear_filter",
        "escape",
        "Clear filter",
        "Clear the filter and show every thread",
        show=False,
        rule=_filter_open,
    ),
    # While the filter has the focus, the arrows still move the table's cursor.
    Action("threads.up", "cursor('up')", "up", "", "Select the thread above", show=False),
    Action("threads.down", "cursor('down')", "down", "", "Select the thread below", show=False),
    Action("threads.page_up", "cursor('page_up')", "pageup", "", "Select a screen up", show=False),
    Action("threads.page_down", "cursor('page_down')", "pagedown", "", "Select a screen down", show=False),
)
"""The picker's keys (:class:`~tui.screens.threads.ThreadsScreen`)."""

TOOL: tuple[Action[ToolFacts], ...] = (
    Action("tool.expand", "expand", "x", "All/less", "The whole output here, scrolling (again: less)", rule=_expand),
    Action("tool.pager", "pager", "p", "Pager", "The whole output in a pager, with search", rule=_pager),
)
"""A focused tool call's keys (:class:`~tui.widgets.tool_call.ToolCallView`), named in the thread's help."""

THREAD: tuple[Action[ThreadFacts], ...] = (
    Action(
        "thread.abort",
        "abort",
        "a",
        "Abort",
        "Abort the running agent",
        "abort the run (another process's run: sent to it as a command)",
        rank=1,
        rule=_loaded(_abort),
    ),
    Action(
        "thread.stop_after_turn",
        "stop_after_turn",
        "A",
        "Stop after turn",
        "Let the running tools finish (results kept), then stop: no further model call",
        "stop after this turn: the running tools finish, their results are kept, no further model call",
        rank=2,
        short="Stop",
        rule=_loaded(_stop),
    ),
    Action(
        "thread.steer",
        "steer",
        "s",
        "Steer",
        "Send a message the agent reads before its next model call",
        "steer: a message the agent reads before its next model call",
        rank=2,
        rule=_loaded(_any_time),
    ),
    Action(
        "thread.interrupt",
        "interrupt",
        "S",
        "Interrupt",
        "Abort the running tools, then send this steer at once",
        "interrupt and send now: abort the running tools (as {thread.abort} does), then the agent reads this and goes on",
        rank=2,
        short="Now",
        rule=_loaded(_while_running("steer")),
    ),
    Action(
        "thread.follow_up",
        "follow_up",
        "f",
        "Follow-up",
        "Queue a message for after the current work",
        "follow-up: a message delivered when the agent would otherwise stop",
        rank=3,
        short="Follow",
        rule=_loaded(_any_time),
    ),
    Action(
        "thread.note",
        "note",
        "o",
        "Note",
        "A note for the next turn; it never wakes a finished agent",
        "note: delivered with the next turn, but it never wakes an agent that is done",
        rank=3,
        rule=_loaded(_while_running("note")),
    ),
    Action(
        "thread.answer",
        "answer",
        "y",
        "Answer",
        "Answer the request the thread waits on",
        "answer the request the thread waits on: approve, deny with a reason, edit the arguments, or each question",
        rank=1,
        rule=_answer,
    ),
    Action(
        "thread.queued",
        "queued",
        "c",
        "Queued",
        "Select the next queued steer or follow-up (then edit or cancel it)",
        "select a queued steer, follow-up or note (listed above the input); "
        "{thread.edit_queued} edits it, {thread.cancel_queued} cancels it",
        help_with=("thread.edit_queued", "thread.cancel_queued"),
        show=False,
    ),
    Action("thread.edit_queued", "edit_queued", "E", "Edit", "Edit the selected queued message", show=False),
    Action("thread.cancel_queued", "cancel_queued", "D", "Cancel", "Cancel the selected queued message", show=False),
    Action(
        "thread.resume",
        "resume",
        "r",
        "Resume",
        "Resume the crashed run (shows the plan first)",
        "resume a crashed thread (shows what happens to each call and asks first)",
        rank=2,
        rule=_loaded(_resume),
    ),
    Action(
        "thread.prompt",
        "new_prompt",
        "n",
        "Prompt",
        "Send a new prompt in this thread",
        "send a new prompt in this thread",
        rank=2,
        rule=_loaded(_new_prompt),
    ),
    Action("thread.earlier", "earlier", "e", "Earlier", "Show earlier messages", "show earlier messages", show=False),
    Action(
        "thread.tool",
        "tool_call",
        "t",
        "Tool",
        "Focus the last tool call (again: the one before)",
        "{thread.tool} focuses the last tool call (again: the one before); {tool.expand} shows all its output "
        "(again: less), {tool.pager} a pager: / search, n / N next / previous, Escape closes",
        help_with=("tool.expand", "tool.pager"),
        rank=4,
    ),
    Action(
        "thread.back",
        "back",
        "q",
        "Back",
        "Back to the thread list (runs keep going)",
        "back to the threads (a running agent keeps running)",
        rank=1,
    ),
)
"""The thread screen's keys (:class:`~tui.screens.thread.ThreadScreen`), in footer order."""

TABLES: Mapping[str, tuple[Action[Any], ...]] = {"app": APP, "threads": PICKER, "tool": TOOL, "thread": THREAD}
"""Every table by its id prefix (an action's id is ``PREFIX.NAME``)."""

BY_ID: Mapping[str, Action[Any]] = {action.id: action for table in TABLES.values() for action in table}
"""Every action by its id: what a keymap may name."""

RANKS: Mapping[str, int] = {action.id: action.rank for action in BY_ID.values()}
"""The footer's priority of each binding id (:attr:`Action.rank`)."""

SHORT: Mapping[str, str] = {action.id: action.short for action in BY_ID.values() if action.short}
"""The footer's shorter label of each binding id that has one (:attr:`Action.short`)."""


# --- keys now (after a keymap) --------------------------------------------------------


def current_keymap(app: App[object]) -> Mapping[str, str]:
    """The keymap ``app`` applies now (binding id → Textual's comma-separated key names)."""
    # Textual keeps the keymap set by App.set_keymap / update_keymap private and offers no
    # getter; reading it here (one place) lets help and notices name the keys as remapped.
    return app._keymap


def key_names(keymap: Mapping[str, str]) -> KeyName:
    """For each action id, its keys under ``keymap`` as the help writes them (``"Enter"``,
    ``"/"``, ``"c"``, ``"ctrl+a"``; several joined by ``" or "``). ``KeyError`` for an
    unknown id (a bug in a table)."""

    def name(action_id: str) -> str:
        keys = keymap.get(action_id) or BY_ID[action_id].keys
        return " or ".join(shown_key(key.strip()) for key in keys.split(","))

    return name


def shown_key(key: str) -> str:
    """One of Textual's key names as the help writes it: ``"slash"`` → ``"/"``, ``"enter"``
    → ``"Enter"``, ``"A"`` → ``"A"``, ``"ctrl+a"`` → ``"ctrl+a"``."""
    if key in _NAMED:
        return key.capitalize()
    return format_key(key)  # Textual's own display of a key: "/" for slash, "?" for question_mark


_NAMED = frozenset(("enter", "escape", "tab", "space", "backspace", "delete", "insert", "home", "end"))
"""Keys the help writes as words (Textual's footer shows some as symbols: ⏎, esc)."""


def help_line(action: Action[Any], name: KeyName) -> tuple[str, str]:
    """``action``'s help row ``(keys, meaning)`` with keys named by ``name`` (:func:`key_names`).
    ``ValueError`` when ``action`` has no help line of its own."""
    if action.help is None:
        raise ValueError(f"{action.id} has no help line of its own")
    keys = " ".join(name(action_id) for action_id in (action.id, *action.help_with))
    return keys, fill_keys(action.help, name)


def fill_keys(text: str, name: KeyName) -> str:
    """``text`` (a table's own words, never stored text) with each ``{ID}`` replaced by that
    action's keys now."""
    return _PLACEHOLDER.sub(lambda found: name(found.group(1)), text)


_PLACEHOLDER = re.compile(r"\{([a-z_]+\.[a-z_]+)\}")
"""An action id in braces, in a table's help line."""


def bound_action(screen: DOMNode, key: str, owner: DOMNode | None = None) -> str | None:
    """The action of ``owner``'s own bindings (by default ``screen``'s) that ``key`` would
    run now on ``screen``, as Textual resolves it (the focused widget first, the keymap
    applied); ``None`` when the key is some other node's, or nobody's."""
    owner = screen if owner is None else owner
    # Textual's binding chain is where it resolves a key (keymap applied, keys a focused
    # Input consumes removed); it has no public form.
    for namespace, bindings_map in screen._binding_chain:  # type: ignore[attr-defined]
        found = bindings_map.key_to_bindings.get(key)
        if found:
            return found[0].action if namespace is owner else None
    return None


# --- availability ---------------------------------------------------------------------

_THREAD_BY_NAME: Mapping[str, Action[ThreadFacts]] = {action.name: action for action in THREAD}
_PICKER_BY_NAME: Mapping[str, Action[PickerFacts]] = {action.name: action for action in PICKER}


def thread_availability(action: str, facts: ThreadFacts, key: KeyName) -> Availability:
    """Whether the thread screen's ``action`` (its :attr:`Action.name`) is available with
    ``facts``, and if not why, naming keys by ``key`` (an action id → its keys now); an
    action of no row of :data:`THREAD` is available."""
    row = _THREAD_BY_NAME.get(action)
    return ENABLED if row is None else row.availability(facts, key)


_TOOL_BY_NAME: Mapping[str, Action[ToolFacts]] = {action.name: action for action in TOOL}


def tool_availability(action: str, facts: ToolFacts, key: KeyName) -> Availability:
    """Whether a tool call's ``action`` is available with ``facts``, and if not why, naming
    keys by ``key``; an action of no row of :data:`TOOL` is available."""
    row = _TOOL_BY_NAME.get(action)
    return ENABLED if row is None else row.availability(facts, key)


def picker_availability(action: str, facts: PickerFacts) -> Availability:
    """Whether the picker's ``action`` is available with ``facts`` (never a sentence: each
    of its keys does something, or is another widget's)."""
    row = _PICKER_BY_NAME.get(action)
    return ENABLED if row is None else row.availability(facts, key_names({}))
