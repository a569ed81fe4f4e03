"""AnswerModal: the dialog that answers a thread's pending human request, and the flow around it.

What it asks, by the request's kind (:mod:`core.hitl`):

* **approval** of a tool call: the tool, its call id, all its arguments and the details;
  ``a`` approve, ``d`` deny (with a reason, optional), ``e`` edit the arguments (JSON, checked:
  an object, or the dialog says why not);
* **yes/no**: ``y`` or ``n``;
* **questions** (one or several in one dialog): each with its options, picked by number
  (``1``-``9`` in the focused list, or the arrows and space), several for a multi-choice
  question, free text where the question takes it or an option allows it.

``ctrl+s`` (or Enter in a text field, or the Send button) sends; the reply is checked
against the request first (:func:`core.hitl_replies.answer_json_for`: a required question left
out, an option that does not exist), and a reply that does not fit keeps the dialog open
with the sentence. The dialog never writes: :func:`answer_pending` records the reply
through the session (:func:`core.answers.answer`, exactly once), and turns its refusals
(answered meanwhile, the request changed) into one-sentence notices. Every word of the
request comes from another program and is shown literally.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, Input, RadioButton, RadioSet, SelectionList, Static, TextArea

from core.errors import AnswerMismatchError, CubepiError, UnreadableRequestError
from core.hitl import ApproveRequest, AskRequest, ConfirmRequest, HumanRequest, Option, Question, parse_request
from core.hitl_replies import ApproveReply, DenyReply, EditReply, KeyedReply, Reply, YesNoReply, answer_json_for
from tui.screens.modals import ConfirmModal, LineInput, OnceModal, fit_scroll
from tui.text import clean, literal
from tui.widgets.pending_request import pretty_json

if TYPE_CHECKING:
    from tui.screens.thread_view import ThreadView

__all__ = ["DECISIONS", "AnswerModal", "answer_pending"]

DECISIONS = ("approve", "deny", "edit")
"""An approval's choices, in the order the dialog lists them (keys ``a``, ``d``, ``e``)."""

MIN_REQUEST_ROWS = 3
"""Rows the request's part keeps however short the terminal (then the buttons may not fit)."""

_DECISION_LABELS = {"approve": "Approve (a)", "deny": "Deny (d)", "edit": "Edit the arguments (e)"}


class NumberedRadioSet(RadioSet):
    """A RadioSet whose ``1``-``9`` keys press that button (the options are listed numbered)."""

    def on_key(self, event: events.Key) -> None:
        if event.character is None or not event.character.isdigit() or event.character == "0":
            return
        buttons = list(self.query(RadioButton))
        index = int(event.character) - 1
        if index < len(buttons):
            event.stop()
            buttons[index].value = True


class NumberedSelectionList(SelectionList[str]):
    """A SelectionList whose ``1``-``9`` keys toggle that option."""

    def on_key(self, event: events.Key) -> None:
        if event.character is None or not event.character.isdigit() or event.character == "0":
            return
        index = int(event.character) - 1
        if index < self.option_count:
            event.stop()
            self.toggle(self.get_option_at_index(index).value)


class AnswerModal(OnceModal[Reply | None]):
    """Ask the person for the answer to ``request`` (a pending request of ``thread_id``);
    dismisses with the :data:`~core.hitl_replies.Reply` (checked to fit the request), or ``None``
    on Escape. See the module docstring for the keys."""

    BINDINGS = [
        Binding("ctrl+s", "send", "Send", id="answer.send", tooltip="Send the answer"),
        Binding("escape", "cancel", "Cancel", id="answer.cancel", tooltip="Close without answering"),
        Binding("a", "decide('approve')", "Approve", id="answer.approve", show=False),
        Binding("d", "decide('deny')", "Deny", id="answer.deny", show=False),
        Binding("e", "decide('edit')", "Edit", id="answer.edit", show=False),
        Binding("y", "yes_no(True)", "Yes", id="answer.yes", show=False),
        Binding("n", "yes_no(False)", "No", id="answer.no", show=False),
    ]

    DEFAULT_CSS = """
    AnswerModal .dialog > VerticalScroll { height: auto; max-height: 50%; }
    AnswerModal .question { margin: 1 0 0 0; height: auto; }
    AnswerModal RadioSet, AnswerModal SelectionList { width: 100%; height: auto; }
    AnswerModal TextArea { height: 10; }
    AnswerModal #answer-error { color: $text-error; height: auto; }
    """

    def __init__(self, thread_id: str, request: HumanRequest) -> None:
        super().__init__(classes="modal")
        self.thread_id = thread_id
        self.request = request

    # --- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        payload = self.request.payload
        with Vertical(classes="dialog"):
            yield Static(self._title(), classes="title")
            with VerticalScroll():
                if isinstance(payload, ApproveRequest):
                    yield from self._approval(payload)
                elif isinstance(payload, ConfirmRequest):
                    yield from self._confirm(payload)
                else:
                    for index, question in enumerate(payload.questions):
                        yield from self._question(index, question)
            yield Static("", id="answer-error")
            yield Static(Text(self._hint(), style="dim"), classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("Send (ctrl+s)", variant="primary", id="send")
                yield Button("Cancel (Esc)", id="cancel")

    def _title(self) -> Text:
        title = Text("Answer thread ", style="bold")
        title.append_text(literal(self.thread_id, style="bold"))
        return title

    def _hint(self) -> str:
        payload = self.request.payload
        if isinstance(payload, ApproveRequest):
            return "a approve · d deny (a reason is optional) · e edit the arguments (JSON) · ctrl+s sends"
        if isinstance(payload, ConfirmRequest):
            return "y yes · n no · ctrl+s sends"
        return "1-9 picks an option of the focused question · Tab moves on · ctrl+s sends"

    def _approval(self, payload: ApproveRequest) -> ComposeResult:
        body = Text("The agent wants to run ")
        body.append_text(literal(payload.tool_name, style="bold"))
        body.append("  ")
        body.append_text(literal(payload.tool_call_id, style="dim"))
        body.append(" with:\n")
        body.append_text(literal(pretty_json(payload.args)))
        if payload.details:
            body.append("\ndetails ", style="dim")
            body.append_text(literal(pretty_json(payload.details)))
        yield Static(body, id="answer-request", classes="body")
        with NumberedRadioSet(id="decision"):
            for decision in DECISIONS:
                yield RadioButton(_DECISION_LABELS[decision], id=f"decision-{decision}")
        reason = LineInput(placeholder="why not (optional): the agent reads it as the tool's result", id="reason")
        reason.display = False
        yield reason
        edit = TextArea(clean(pretty_json(payload.args)), id="edited-args", soft_wrap=True, show_line_numbers=False)
        edit.display = False
        yield edit

    def _confirm(self, payload: ConfirmRequest) -> ComposeResult:
        body = literal(payload.prompt)
        if payload.details:
            body.append("\ndetails ", style="dim")
            body.append_text(literal(pretty_json(payload.details)))
        yield Static(body, id="answer-request", classes="body")
        with NumberedRadioSet(id="yes-no"):
            yield RadioButton("Yes (y)", id="answer-yes")
            yield RadioButton("No (n)", id="answer-no")

    def _question(self, index: int, question: Question) -> ComposeResult:
        prompt = Text(f"{index + 1}. ", style="bold")
        prompt.append_text(literal(question.prompt))
        if not question.required:
            prompt.append(" (optional)", style="dim")
        yield Static(prompt, classes="question")
        options = question.options or []
        if options and question.multi_select:
            yield NumberedSelectionList(
                *((_option_label(n, o, described=False), o.value) for n, o in enumerate(options, 1)),
                id=f"choices-{index}",
            )
        elif options:
            with NumberedRadioSet(id=f"choices-{index}"):
                for n, option in enumerate(options, 1):
                    yield RadioButton(_option_label(n, option, described=True))
        if not options or any(o.allow_input for o in options):
            placeholder = "your answer" if not options else "or your own text (for the option that allows it)"
            yield LineInput(placeholder=placeholder, id=f"text-{index}")

    def on_mount(self) -> None:
        first = self.query("RadioSet, SelectionList, Input")
        if first:
            first.first().focus()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        """Let the request's part (the scroll) take the rows the dialog has left once its
        title, the error line, the hint and the buttons are drawn (:func:`fit_scroll`)."""
        if not self.is_attached:
            return
        dialog = self.query_one(".dialog", Vertical)
        fit_scroll(self, dialog, dialog.query_one(VerticalScroll), least=MIN_REQUEST_ROWS)

    # --- choosing ---------------------------------------------------------------------------

    def action_decide(self, decision: str) -> None:
        """Choose an approval's ``decision`` (``approve``, ``deny`` or ``edit``)."""
        if not isinstance(self.request.payload, ApproveRequest):
            return
        self.query_one(f"#decision-{decision}", RadioButton).value = True

    def action_yes_no(self, yes: bool) -> None:
        """Choose yes or no (a yes/no question)."""
        if not isinstance(self.request.payload, ConfirmRequest):
            return
        self.query_one("#answer-yes" if yes else "#answer-no", RadioButton).value = True

    @on(RadioSet.Changed, "#decision")
    def _decided(self, event: RadioSet.Changed) -> None:
        decision = DECISIONS[event.index]
        reason = self.query_one("#reason", Input)
        edit = self.query_one("#edited-args", TextArea)
        reason.display = decision == "deny"
        edit.display = decision == "edit"
        shown = reason if decision == "deny" else edit if decision == "edit" else None
        if shown is not None:
            shown.focus()
            # Shown just now, it has no place in the layout yet: scrolled to once it has one.
            self.call_after_refresh(shown.scroll_visible)
        self._say("")

    # --- sending ----------------------------------------------------------------------------

    @on(Input.Submitted)
    @on(Button.Pressed, "#send")
    def action_send(self) -> None:
        """Send the reply once it fits the request; else say why not and stay open."""
        try:
            reply = self.reply()
            answer_json_for(self.request, reply)
        except AnswerMismatchError as error:
            self._say(str(error))
            return
        self.answer_once(reply)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        """Close without answering."""
        self.answer_once(None)

    def _say(self, sentence: str) -> None:
        self.query_one("#answer-error", Static).update(literal(sentence))
        self.call_after_refresh(self._fit)  # a sentence of two lines takes a row from the request

    def reply(self) -> Reply:
        """The reply the dialog holds now. Raises :class:`~core.errors.AnswerMismatchError`
        (one sentence) when nothing is chosen yet or edited arguments are not a JSON object."""
        payload = self.request.payload
        if isinstance(payload, ApproveRequest):
            return self._approval_reply()
        if isinstance(payload, ConfirmRequest):
            chosen = self._pressed("#yes-no")
            if chosen is None:
                raise AnswerMismatchError("Choose yes (y) or no (n) first.")
            return YesNoReply(chosen == 0)
        return self._keyed_reply(payload)

    def _approval_reply(self) -> Reply:
        chosen = self._pressed("#decision")
        if chosen is None:
            raise AnswerMismatchError("Choose approve (a), deny (d) or edit (e) first.")
        decision = DECISIONS[chosen]
        if decision == "approve":
            return ApproveReply()
        if decision == "deny":
            return DenyReply(self.query_one("#reason", Input).value.strip() or None)
        text = self.query_one("#edited-args", TextArea).text
        try:
            args = json.loads(text)
        except ValueError as error:
            raise AnswerMismatchError(f"The edited arguments are not JSON ({error}).") from None
        if not isinstance(args, dict):
            raise AnswerMismatchError("The edited arguments must be a JSON object, as the tool's arguments are.")
        return EditReply(args)

    def _keyed_reply(self, payload: AskRequest) -> KeyedReply:
        values: dict[str, str | list[str]] = {}
        for index, question in enumerate(payload.questions):
            typed = self._typed(index)
            options = question.options or []
            if options and question.multi_select:
                chosen = list(self.query_one(f"#choices-{index}", SelectionList).selected)
                values_of = chosen + ([typed] if typed else [])
                if values_of or question.required:
                    values[question.key] = values_of
                continue
            picked = self._pressed(f"#choices-{index}") if options else None
            if typed and (picked is None or options[picked].allow_input):
                values[question.key] = typed
            elif picked is not None:
                values[question.key] = options[picked].value
            elif question.required:
                values[question.key] = ""  # refused by the check, which names the question
        return KeyedReply(values)

    def _typed(self, index: int) -> str:
        found = self.query(f"#text-{index}")
        return found.first(Input).value.strip() if found else ""

    def _pressed(self, selector: str) -> int | None:
        buttons = list(self.query_one(selector, RadioSet).query(RadioButton))
        return next((i for i, button in enumerate(buttons) if button.value), None)


async def answer_pending(view: ThreadView) -> None:
    """Answer the pending request ``view`` shows: the dialog, then the answer recorded
    through the session (once; the run that asked applies it, in whatever process). A
    browse-only store is upgraded first if the person agrees. Each refusal (someone
    answered first: the sentence shows that answer; the request was settled or changed;
    the store's errors) becomes a one-sentence notice; the view then reads the request
    again. Runs in a worker of ``view`` (it waits on the dialog)."""
    pending = view.pending
    if pending is None:
        view.notify("Nothing to answer: the thread is not waiting for an answer.", timeout=6, markup=False)
        return
    try:
        request = parse_request(pending.request_json)
    except UnreadableRequestError as error:
        view.notify(clean(error), severity="warning", timeout=8, markup=False)
        return
    reply = await view.app.push_screen_wait(AnswerModal(view.thread_id, request))
    if reply is None:
        return
    session = view.session
    try:
        if session.needs_upgrade:
            question = ConfirmModal("Upgrade this database?", session.upgrade_explanation, yes="Upgrade")
            if not await view.app.push_screen_wait(question):
                view.notify("Not answered: the database was left unchanged; it stays browse-only.", markup=False)
                return
            await session.upgrade()
        answered = await session.answer(view.thread_id, reply, question_id=request.question_id)
    except CubepiError as error:
        view.notify(clean(error), severity="warning", timeout=12, markup=False)
    else:
        view.notify(clean(answered.sentence), timeout=8, markup=False)
    view.reload_pending()


def _option_label(n: int, option: Option, *, described: bool) -> Text:
    """Option ``n`` of a question as its dialog lists it: the number, then the label (and,
    ``described``, its description) exactly as the agent wrote them, never parsed as
    markup (a string label would be: ``[b]x[/b]`` would show bold)."""
    label = Text(f"{n}  ")
    label.append_text(literal(option.label))
    if described and option.description:
        label.append(" - ")
        label.append_text(literal(option.description))
    return label
