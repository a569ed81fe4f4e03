"""CrashBanner: what a crashed, failed or waiting thread's diagnosis says, and what ``r`` will do about it."""

from __future__ import annotations

from collections.abc import Mapping

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from core.recovery import CrashPoint, Diagnosis, ResumeAction, ThreadState
from tui.attention import waiting_for_you
from tui.text import clean, literal, short_json

_HEADLINES = {
    CrashPoint.BETWEEN_TURNS: "Crashed between turns (point 1)",
    CrashPoint.AFTER_TOOL_RESULT: "Crashed after a tool result (point 2)",
    CrashPoint.MID_TOOL: "Crashed mid-tool (point 3)",
}


_SHOWN = (ThreadState.CRASHED, ThreadState.FAILED, ThreadState.WAITING)
_STATE_HEADLINES = {
    ThreadState.FAILED: "The last model call failed",
    ThreadState.WAITING: "Waiting for an answer",
}


def crash_headline(diagnosis: Diagnosis) -> str:
    """ "Crashed mid-tool (point 3)" and the like, "The last model call failed", "Waiting
    for an answer"; the diagnosis label for clean states."""
    if diagnosis.crash_point is None:
        return _STATE_HEADLINES.get(diagnosis.state, diagnosis.label)
    return _HEADLINES[diagnosis.crash_point]


def where_words(status_words: str, step_words: str = "") -> str:
    """Where a dangling call stopped, for people: the journal's words ("started 17:00:40,
    never finished"), then, for a stepped tool, its last committed step ("step 2 of 8
    committed at 17:00:43", :func:`core.recovery.step_words`); the banner and the resume
    confirmation both say it so."""
    return f"{status_words}; {step_words}" if step_words else status_words


def describe(diagnosis: Diagnosis, steps: Mapping[str, str] | None = None) -> Text:
    """The banner's text: headline, detail, each dangling call, and the resume plan.
    ``steps`` maps a dangling call's id to its last committed step in words (stepped
    tools only, see :func:`where_words`)."""
    steps = steps or {}
    text = Text()
    text.append(crash_headline(diagnosis), style="bold")
    if diagnosis.detail:
        text.append("  ")
        text.append_text(literal(diagnosis.detail))
    for dangling in diagnosis.dangling:
        call = dangling.call
        text.append("\n  • ")
        text.append(clean(call.name), style="bold")
        text.append(f"  {clean(call.id)}  ", style="dim")
        text.append(short_json(call.arguments, 120))
        text.append(f"  — {where_words(dangling.status_words, steps.get(call.id, ''))}", style="italic")
    text.append("\n")
    text.append("r: ", style="bold")
    if diagnosis.dangling and diagnosis.action is not ResumeAction.NONE:
        # What happens to each call depends on the agent's tools and their jobs: the
        # confirmation shows it call by call (and the choices) before anything runs.
        text.append("shows what resume will do with each call and asks first. ")
    text.append(diagnosis.resume_plan)
    return text


def repairs_line(words: list[str]) -> str:
    """The thread view's line on what the request builder does in what is sent, from
    :func:`core.request.repair_words`; empty when it does nothing."""
    if not words:
        return ""
    return "Sent to the model: " + "; ".join(words) + " (the stored messages are unchanged)."


def _banner_shown(diagnosis: Diagnosis | None) -> bool:
    """Whether the banner shows: a crash, a failure, or a request answered and to be
    applied by resume; a request still to be answered is the request panel's
    (:mod:`tui.widgets.pending_request`), with the key that answers it."""
    return diagnosis is not None and diagnosis.state in _SHOWN and not waiting_for_you(diagnosis)


class CrashBanner(Static):
    """Shown above the transcript while the thread's diagnosis is CRASHED, FAILED (with the
    provider's error) or WAITING with its answer stored (resume applies it); hidden otherwise."""

    DEFAULT_CSS = """
    CrashBanner {
        height: auto;
        display: none;
        padding: 0 1;
        background: $error 15%;
        border: tall $error;
        &.-crashed { display: block; }
        /* Not a fault: the run is paused on a person, so no error colours. */
        &.-waiting { background: $warning 10%; border: tall $warning; }
    }
    """

    diagnosis: reactive[Diagnosis | None] = reactive(None, always_update=True)
    """The thread's diagnosis; the banner shows only when its state is CRASHED, FAILED or WAITING."""

    steps: reactive[dict[str, str]] = reactive(dict, always_update=True)
    """Tool call id -> its last committed step in words ("step 2 of 8 committed at
    17:00:43"), for the dangling calls of stepped tools (read from the store after the
    diagnosis; empty until then)."""

    def watch_diagnosis(self, diagnosis: Diagnosis | None) -> None:
        self.set_class(_banner_shown(diagnosis), "-crashed")
        self.set_class(diagnosis is not None and diagnosis.state is ThreadState.WAITING, "-waiting")
        self._draw()

    def watch_steps(self, steps: dict[str, str]) -> None:
        self._draw()

    def _draw(self) -> None:
        diagnosis = self.diagnosis
        self.update(describe(diagnosis, self.steps) if _banner_shown(diagnosis) and diagnosis is not None else "")
