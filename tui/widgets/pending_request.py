"""PendingRequestPanel: the human request a thread waits on, shown plainly, with the key that answers it.

For an approval: the tool, its call id and its arguments (pretty JSON, cut at
:data:`ARG_LINES` lines) and the details the asker gave; for a yes/no question its prompt;
for an ask each question with its options, numbered as the answer dialog numbers them.
Then how long it has waited and, when the asker set one, when it gives up. Every word of a
request comes from another program (a model's arguments, a tool's prompt): it is drawn
through :func:`tui.text.literal`, never as markup.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from core.checkpoint.base import PendingRequest
from core.errors import UnreadableRequestError
from core.hitl import ApproveRequest, AskRequest, ConfirmRequest, HumanRequest, Question, parse_request
from tui.attention import WAITING_WORDS
from tui.text import clean, literal

ANSWER_KEY = "y"
"""The thread screen's key that opens the answer dialog (its binding is ``thread.answer``)."""

ARG_LINES = 12
"""Lines of an approval's pretty-printed arguments shown; the dialog shows them all."""


def waited_words(seconds: float) -> str:
    """How long a request has waited, for people: "just now", "12 s", "4 min", "2 h 5 min", "3 d"."""
    seconds = max(0.0, seconds)
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        hours, minutes = divmod(int(seconds // 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{int(seconds // 86400)} d"


def pretty_json(value: Any, limit: int | None = None) -> str:
    """``value`` as indented JSON (UTF-8 kept), cut after ``limit`` lines with a line saying
    how many more there are; ``repr`` for what JSON cannot hold. Raw: clean it to show it."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    lines = text.splitlines()
    if limit is not None and len(lines) > limit:
        more = len(lines) - limit
        lines = [*lines[:limit], f"… ({more} more line{'s' if more != 1 else ''}: press {ANSWER_KEY} to see all)"]
    return "\n".join(lines)


def option_words(question: Question) -> str:
    """What a question takes, in words: "free text", "one of:" / "any of:" for options."""
    if not question.options:
        return "free text"
    return "any of:" if question.multi_select else "one of:"


def describe_request(
    pending: PendingRequest, *, answer_json: str | None = None, now: float | None = None, key: str = ANSWER_KEY
) -> Text:
    """The panel's text for ``pending`` (see the module docstring); ``answer_json`` the
    answer already stored for it, shown when given (the panel says it was answered and is
    not yet applied then, and whenever ``pending.answered`` says so); ``now`` unix seconds (default: the clock); ``key`` the key that answers.
    A request this version cannot read is said so, in one sentence."""
    now = time.time() if now is None else now
    text = Text()
    try:
        request = parse_request(pending.request_json)
    except UnreadableRequestError as error:
        text.append("A pending request", style="bold")
        text.append("  ")
        text.append_text(literal(str(error)))
        return text
    # The store's flag says so with the request itself; the answer's text is read after it.
    answered = answer_json is not None or pending.answered
    headline = "Answered, not applied yet" if answered else _headline(request)
    text.append(headline, style="bold")
    waited = waited_words(now - request.created_at)
    text.append(f"  · asked {waited}" if waited == "just now" else f"  · asked {waited} ago", style="dim")
    if request.timeout_seconds is not None and not answered:
        left = request.created_at + request.timeout_seconds - now
        text.append(f" · gives up in {waited_words(left)}" if left > 0 else " · its time limit has passed", style="dim")
    _body(text, request)
    text.append("\n")
    if answered:
        if answer_json is not None:
            text.append("answer: ", style="bold")
            text.append_text(literal(answer_json))
            text.append("  ")
        text.append("(the run that asked applies it; if nobody runs the thread, r resumes it)", style="dim")
    else:
        text.append(f"{key}: ", style="bold")
        text.append("answer it")
    return text


def _headline(request: HumanRequest) -> str:
    payload = request.payload
    if isinstance(payload, ApproveRequest):
        return f"{WAITING_WORDS.capitalize()}: approve a tool call?"
    if isinstance(payload, ConfirmRequest):
        return f"{WAITING_WORDS.capitalize()}: yes or no?"
    count = len(payload.questions)
    return f"{WAITING_WORDS.capitalize()}: {'a question' if count == 1 else f'{count} questions'}"


def _body(text: Text, request: HumanRequest) -> None:
    payload = request.payload
    if isinstance(payload, ApproveRequest):
        text.append("\n  ")
        text.append_text(literal(payload.tool_name, style="bold"))
        text.append("  ")
        text.append_text(literal(payload.tool_call_id, style="dim"))
        for line in clean(pretty_json(payload.args, ARG_LINES)).splitlines():
            text.append("\n    ")
            text.append_text(literal(line))
        _details(text, payload.details)
    elif isinstance(payload, ConfirmRequest):
        text.append("\n  ")
        text.append_text(literal(payload.prompt))
        _details(text, payload.details)
    elif isinstance(payload, AskRequest):
        for number, question in enumerate(payload.questions, 1):
            _question(text, number, question, numbered=len(payload.questions) > 1)


def _question(text: Text, number: int, question: Question, *, numbered: bool) -> None:
    text.append(f"\n  {number}. " if numbered else "\n  ")
    text.append_text(literal(question.prompt))
    text.append(f"  ({option_words(question)}{'' if question.required else ', optional'})", style="dim")
    for index, option in enumerate(question.options or (), 1):
        text.append(f"\n      {index} ", style="bold")
        text.append_text(literal(option.label))
        if option.value != option.label:
            text.append_text(literal(f" ({option.value})", style="dim"))
        if option.description:
            text.append_text(literal(f" - {option.description}", style="dim"))
        if option.allow_input:
            text.append(" (or your own text)", style="dim")


def _details(text: Text, details: dict[str, Any] | None) -> None:
    if not details:
        return
    text.append("\n  details ", style="dim")
    text.append_text(literal(json.dumps(details, ensure_ascii=False, default=str)))


class PendingRequestPanel(Static):
    """Shown above the transcript while the thread waits on a person (``pending`` set);
    hidden otherwise. Redraws every :data:`TICK` seconds so the time waited moves on."""

    TICK = 5.0
    """Seconds between redraws of the time waited."""

    DEFAULT_CSS = """
    PendingRequestPanel {
        height: auto;
        max-height: 50%;
        display: none;
        padding: 0 1;
        background: $warning 10%;
        border: tall $warning;
        &.-shown { display: block; }
    }
    """

    pending: reactive[PendingRequest | None] = reactive(None)
    """The request shown (``None``: the panel is hidden)."""

    answer_json: reactive[str | None] = reactive(None)
    """The answer already stored for it, if any (read from the store by the thread view)."""

    def on_mount(self) -> None:
        self.set_interval(self.TICK, self._draw, name="waited")

    def watch_pending(self, pending: PendingRequest | None) -> None:
        self.set_class(pending is not None, "-shown")
        self._draw()

    def watch_answer_json(self) -> None:
        self._draw()

    def _draw(self) -> None:
        pending = self.pending
        if pending is None:
            self.update("")
            return
        self.update(describe_request(pending, answer_json=self.answer_json))
