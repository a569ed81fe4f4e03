"""ResumeModal: what resuming a crashed thread will do, call by call, and the user's choices.

Built from :meth:`core.agent.Agent.plan_resume` (a :class:`~core.recovery.ResumePlan`) and
the steers and follow-ups a crashed runner never delivered (:func:`core.commands.undelivered`).
Each dangling tool call shows where it stopped ("never started", "started 12:03:10, never
finished", "may have started"; for a stepped tool also "step 4 of 8 committed at 12:03:10")
and what resume does with it; a call of a known tool that
is not idempotent offers a choice (marked interrupted, the default, or re-run anyway).
Each undelivered message is either sent with the resume or discarded. The modal dismisses
with a :class:`ResumeDecision`, or ``None`` when cancelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Button, RadioButton, RadioSet, Static

from core.checkpoint.base import Command
from core.recovery import CallPlan, ResumeAction, ResumePlan, SettleChoice
from tui.screens.modals import MIN_BODY_ROWS, OnceModal, fit_scroll
from tui.text import clean, literal, one_line, short_json
from tui.widgets.commands import KIND_WORDS
from tui.widgets.crash_banner import crash_headline, where_words

INTERRUPT_WORDS = "marked interrupted, not re-run"

_SETTLE_HEADING = "Each call without a result is settled first, then the model is called again:"
_SETTLE_HEADINGS = {
    ResumeAction.SETTLE_THEN_WAIT: (
        "Each call without a result is settled; then the thread waits for your next message (the last reply "
        "is final, so the model is not called):"
    ),
    ResumeAction.RETRY_MODEL_CALL: (
        "Each call without a result is settled first, then the failed model call is retried:"
    ),
}
"""What resume does with a call it does not run again (the default for a tool that is not idempotent)."""

RERUN_ANYWAY_WORDS = "re-run anyway (not idempotent: its effects may happen twice)"
"""The choice that runs a call of a non-idempotent tool again."""

SEND_WORDS = "send with the resume"
DISCARD_WORDS = "discard"


def outcome_words(plan: CallPlan) -> str:
    """What resume does with one dangling call by default, in a few words."""
    if not plan.known:
        return f"{INTERRUPT_WORDS} (this agent has no tool named {clean(plan.call.name)})"
    if plan.action == "reuse":
        return "already done — stored result reused"
    if plan.action == "rerun":
        words = (
            "re-run (idempotent; its job failed)"
            if plan.job_status == "failed"
            else "re-run (idempotent; job not done)"
        )
        if plan.idempotent and plan.step is not None and plan.step.next_step > 0:
            words += f", continuing after step {plan.step.next_step}"
        return words
    return INTERRUPT_WORDS


@dataclass(frozen=True, slots=True)
class ResumeDecision:
    """What the user chose: ``choices`` (tool call id -> ``"rerun"`` / ``"interrupt"``, for the
    calls that offer a choice), the undelivered commands to ``send`` with the resume and
    those to ``discard`` (their ``seq`` numbers)."""

    choices: dict[str, SettleChoice] = field(default_factory=dict)
    send: tuple[int, ...] = ()
    discard: tuple[int, ...] = ()


class ResumeModal(OnceModal[ResumeDecision | None]):
    """The resume confirmation: every dangling call with its planned outcome, and the choices.

    | Key | Action |
    | :- | :- |
    | y | resume as shown |
    | n, escape | cancel |
    """

    BINDINGS = [
        Binding("y", "confirm", "Resume", id="resume.confirm", tooltip="Resume with the choices shown"),
        Binding("n,escape", "cancel", "Cancel", id="resume.cancel", tooltip="Close without resuming"),
    ]

    DEFAULT_CSS = """
    ResumeModal .dialog { max-height: 95%; height: auto; }
    ResumeModal #resume-body { height: auto; }
    ResumeModal .call { height: auto; margin: 1 0 0 0; }
    ResumeModal .outcome { height: auto; margin: 0 0 0 4; }
    ResumeModal .outcome.-interrupt { color: $text-warning; }
    ResumeModal .outcome.-rerun { color: $text-accent; }
    ResumeModal .outcome.-reuse { color: $text-success; }
    ResumeModal RadioSet { margin: 0 0 0 3; height: auto; width: auto; }
    ResumeModal .section { height: auto; margin: 1 0 0 0; text-style: bold; }
    """

    def __init__(self, plan: ResumePlan, pending: Sequence[Command] = ()) -> None:
        super().__init__(classes="modal")
        self.plan = plan
        """The plan shown (from ``Agent.plan_resume``)."""
        self.pending = list(pending)
        """Steers and follow-ups the crashed runner never delivered."""
        self._choosers: dict[str, RadioSet] = {}
        self._senders: dict[int, RadioSet] = {}

    def compose(self) -> ComposeResult:
        plan = self.plan
        diagnosis = plan.diagnosis
        with Vertical(classes="dialog"):
            yield Static(Text("Resume this thread?", style="bold"), classes="title")
            head = Text()
            head.append(crash_headline(diagnosis), style="bold")
            if diagnosis.detail:
                head.append("  ")
                head.append_text(literal(diagnosis.detail))
            yield Static(head, classes="body")
            with VerticalScroll(id="resume-body"):
                if plan.calls and plan.action is not ResumeAction.NONE:
                    yield Static(Text(_SETTLE_HEADINGS.get(plan.action, _SETTLE_HEADING)), classes="body")
                    for index, call in enumerate(plan.calls):
                        yield from self._call_rows(index, call)
                else:
                    yield Static(literal(plan.sentence), classes="body")
                if self.pending:
                    yield Static(Text("Messages the crashed run never delivered"), classes="section")
                    for command in self.pending:
                        yield from self._command_rows(command)
            with Horizontal(classes="buttons"):
                yield Button("Resume (y)", variant="primary", id="resume")
                yield Button("Cancel (n)", id="cancel")

    def _call_rows(self, index: int, plan: CallPlan) -> ComposeResult:
        call = plan.call
        line = Text()
        line.append("⚙ ", style="bold")
        line.append(clean(call.name), style="bold")
        line.append(f"  {clean(call.id)}  ", style="dim")
        line.append(short_json(call.arguments, 100))
        line.append("\n    ")
        line.append(where_words(plan.status_words, plan.step_words), style="italic")
        yield Static(line, classes="call", id=f"call-{index}")
        if plan.choices:
            chooser = RadioSet(
                RadioButton(INTERRUPT_WORDS, value=True, id="interrupt"),
                RadioButton(RERUN_ANYWAY_WORDS, id="rerun"),
                id=f"choice-{index}",
            )
            self._choosers[call.id] = chooser
            yield chooser
        else:
            action = "interrupt" if not plan.known else plan.action
            yield Static(Text("→ " + outcome_words(plan)), classes=f"outcome -{action}")

    def _command_rows(self, command: Command) -> ComposeResult:
        words = KIND_WORDS.get(command.kind, command.kind).lower()
        line = Text()
        line.append(f"{words} #{command.seq}  ", style="bold")
        line.append(f"“{one_line(command.text, 70)}”")
        yield Static(line, classes="call")
        chooser = RadioSet(
            RadioButton(SEND_WORDS, value=True, id="send"),
            RadioButton(DISCARD_WORDS, id="discard"),
            id=f"command-{command.seq}",
        )
        self._senders[command.seq] = chooser
        yield chooser

    def on_mount(self) -> None:
        self.query_one("#resume", Button).focus()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit)

    def _fit(self) -> None:
        """Let the calls' part take the rows the dialog has left once its title, the
        diagnosis and the buttons are drawn (:func:`fit_scroll`)."""
        if self.is_attached:
            fit_scroll(self, self.query_one(".dialog", Vertical), self.query_one("#resume-body"), least=MIN_BODY_ROWS)

    # --- the decision -------------------------------------------------------------------

    def choose(self, call_id: str, choice: SettleChoice) -> None:
        """Select ``choice`` for the dangling call ``call_id`` (as clicking its radio button does)."""
        self._choosers[call_id].query_one(f"#{choice}", RadioButton).value = True

    def decision(self) -> ResumeDecision:
        """What the radio buttons say now."""
        choices: dict[str, SettleChoice] = {}
        for call_id, chooser in self._choosers.items():
            pressed = chooser.pressed_button
            choices[call_id] = "rerun" if pressed is not None and pressed.id == "rerun" else "interrupt"
        send, drop = [], []
        for seq, chooser in self._senders.items():
            pressed = chooser.pressed_button
            (drop if pressed is not None and pressed.id == "discard" else send).append(seq)
        return ResumeDecision(choices, tuple(send), tuple(drop))

    @on(Button.Pressed, "#resume")
    def action_confirm(self) -> None:
        """Resume with the choices shown."""
        self.answer_once(self.decision())

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        """Close without resuming."""
        self.answer_once(None)
