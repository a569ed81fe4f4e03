"""StatusBar: thread id, run state, a model call's retry wait, the store's connection, model and token usage."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from core.messages import Usage
from tui.text import clean

_STATE_STYLES = {
    "running": "bold $success",
    "aborting": "bold $warning",
    "aborted": "bold $warning",
    "failed": "bold $error",
    "crashed": "bold $error",
    "running on": "bold magenta",  # a run elsewhere: LeaseView.label names its host
    "waiting for an answer": "bold $warning",
    "answered": "bold $success",  # its answer stored, not yet applied: tui.attention.ANSWERED_WORDS
}
_PREFIXES = sorted(_STATE_STYLES, key=len, reverse=True)

_FITS = (("  ·  ", True, True), (" · ", True, True), (" · ", False, True), (" · ", False, False))
"""How the line gives way when it is wider than the bar, in order (separator, model shown,
tokens shown): narrower separators, then no model, then no token counts (a count cut short
reads as another number); past the last the line is cut with an ellipsis."""


class StatusBar(Static):
    """One line: ``thread · state · retry wait · store notice · model · tokens in/out``,
    giving way on a narrow terminal as :data:`_FITS` says."""

    DEFAULT_CSS = """
    StatusBar {
        height: 1;
        padding: 0 1;
        background: $panel;
        color: $text-muted;
    }
    """

    thread_id: reactive[str] = reactive("")
    """The thread on screen."""

    run_state: reactive[str] = reactive("idle")
    """idle, running, aborting, or the last diagnosis/outcome (completed, aborted, crashed, ...)."""

    retry: reactive[str] = reactive("")
    """The model call's retry wait while there is one (see :func:`core.providers.retry.retry_label`), else empty."""

    store: reactive[str] = reactive("")
    """What is wrong with the store's connection ("reconnecting to …", see ``Session.store_notice``), else empty."""

    model: reactive[str] = reactive("")
    """The model new turns use (or "demo")."""

    input_tokens: reactive[int] = reactive(0)
    """Input tokens of every assistant message on the thread."""

    output_tokens: reactive[int] = reactive(0)
    """Output tokens of every assistant message on the thread."""

    def set_totals(self, totals: Usage) -> None:
        """Show ``totals``, the thread's usage summed once as it was read
        (:attr:`core.outline.ThreadOutline.totals`): one update of each count, whatever the
        thread's length (summing here, two reactive updates per message, took ~1 s at
        100,000 messages, issue 10)."""
        self.input_tokens = totals.input_tokens
        self.output_tokens = totals.output_tokens

    def add_usage(self, usage: Usage | None) -> None:
        """Count one more assistant message's usage (a message persisted after the totals)."""
        if usage is not None:
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens

    def render(self) -> Text:
        width = self.content_size.width
        for separator, model, tokens in _FITS:
            text = self._line(separator, model=model, tokens=tokens)
            if not width or text.cell_len <= width:
                return text
        text.truncate(width, overflow="ellipsis")
        return text

    def _line(self, separator: str, *, model: bool, tokens: bool) -> Text:
        text = Text()
        text.append("thread ", style="dim")
        text.append(clean(self.thread_id), style="bold")
        text.append(separator)
        state_style = self._state_style()
        text.append(clean(self.run_state), style=state_style)  # may hold a lease's host
        if self.retry:
            text.append(separator)
            text.append(clean(self.retry), style=self._themed("bold $warning"))
        if self.store:
            text.append(separator)
            text.append(clean(self.store), style=self._themed("bold $warning"))
        if self.model and model:
            text.append(f"{separator}model ", style="dim")
            text.append(clean(self.model))
        if tokens:
            text.append(f"{separator}tokens ", style="dim")
            text.append(f"{self.input_tokens:,} in / {self.output_tokens:,} out")
        return text

    def _state_style(self) -> str:
        # By prefix, longest first: a label may carry details and notes
        # ("crashed at point 3 (mid-tool) · 1 orphan result", "waiting for an answer: ...").
        key = next((p for p in _PREFIXES if self.run_state.startswith(p)), "")
        return self._themed(_STATE_STYLES.get(key, "bold"))

    def _themed(self, style: str) -> str:
        # Theme variables are resolved against the app's theme so colours follow it.
        if "$" in style:
            variables = self.app.theme_variables
            for name in ("success", "warning", "error"):
                style = style.replace(f"${name}", variables.get(name, name))
        return style
