"""Views of single messages: user prompts, assistant replies (live or finished), raw rows.

Assistant text is Markdown; a live reply's text streams into a
:class:`~tui.widgets.live_markdown.LiveMarkdown` (one append per flush, costing what the open
tail costs, never the whole reply); everything else is a literal ``Text``. All stored strings
pass through :func:`tui.text.clean` first.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static

from core.messages import (
    AnyMessage,
    AssistantMessage,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from tui.text import clean, clock, content_text, literal, short_json
from tui.widgets.lean_frames import BlankLines, CoarseIndex, SettledSize
from tui.widgets.live_markdown import LiveMarkdown
from tui.widgets.tool_call import ToolCallView

_KIND_LABELS = {"prompt": "you", "steer": "you · steer", "follow_up": "you · follow-up"}


def user_kind(message: UserMessage) -> str:
    """``prompt``, ``steer`` or ``follow_up`` (messages from other programs count as prompts)."""
    kind = (message.metadata or {}).get("kind", "prompt")
    return kind if kind in _KIND_LABELS else "prompt"


class UserMessageView(Static):
    """A user message; steers and follow-ups are labelled as such."""

    DEFAULT_CSS = """
    UserMessageView {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        background: $boost;
        border-left: outer $primary;
        &.-steer { border-left: outer $warning; }
        &.-follow_up { border-left: outer $secondary; }
    }
    """

    def __init__(self, message: UserMessage) -> None:
        kind = user_kind(message)
        text = Text()
        text.append(_KIND_LABELS[kind], style="bold")
        text.append(f"  {clock(message.timestamp)}\n", style="dim")
        text.append_text(literal(content_text(message.content) or _raw_content(message.content)))
        super().__init__(text, classes=f"-{kind}")


class ThinkingView(Collapsible):
    """The model's reasoning, dimmed and collapsed by default."""

    DEFAULT_CSS = """
    ThinkingView {
        height: auto;
        color: $text-muted;
        border-top: none;
        padding: 0;
        margin: 0 0 0 1;
        & Static { color: $text-muted; text-style: italic; }
    }
    """

    def __init__(self, thinking: str) -> None:
        self._raw = thinking
        self._thinking = Static(literal(thinking))
        super().__init__(self._thinking, title="thinking", collapsed=True)

    def set_thinking(self, thinking: str) -> None:
        """Show the reasoning so far. While collapsed only the text is kept: cleaning and
        laying out a long reasoning on every flush cost as much as the reasoning is long."""
        self._raw = thinking
        if not self.collapsed:
            self._thinking.update(literal(thinking))

    def on_collapsible_expanded(self, event: Collapsible.Expanded) -> None:
        if event.collapsible is self:
            self._thinking.update(literal(self._raw))


class AssistantMessageView(SettledSize, BlankLines, CoarseIndex, Vertical):
    """An assistant reply: thinking, Markdown text and tool calls, in content order.

    Built finished (``AssistantMessageView(message)``) or live: call :meth:`sync` with the
    growing partial message as often as the screen flushes, then :meth:`finish` with the
    persisted message. Work per sync is proportional to what arrived, not to the reply;
    a frame lays it out once and draws nothing of its own (:mod:`tui.widgets.lean_frames`).
    """

    DEFAULT_CSS = """
    AssistantMessageView {
        height: auto;
        margin: 1 0 0 0;
        & > .who { height: 1; color: $accent; text-style: bold; }
        & > Markdown { margin: 0 0 0 1; padding: 0; background: transparent; }
        & > .footer { height: auto; color: $text-muted; margin: 0 0 0 1; }
        & > .footer.-error { color: $text-error; }
        & > .footer.-aborted { color: $warning; }
    }
    """

    def __init__(self, message: AssistantMessage, *, live: bool = False) -> None:
        super().__init__()
        self._message = message
        self.live = live
        self._views: list[Widget] = []
        self._seen: list[int] = []  # characters already shown, per content block
        self.tool_views: dict[str, ToolCallView] = {}
        """The view of each tool call of this reply, by call id (filled as blocks appear)."""
        for index, block in enumerate(message.content):
            self._views.append(self._view_for(index, block))

    def compose(self) -> ComposeResult:
        yield Static(self._who(self._message), classes="who")
        yield from self._views
        if not self.live:
            footer = self._footer(self._message)
            if footer is not None:
                yield footer

    @property
    def message(self) -> AssistantMessage:
        """The reply as last shown (partial while live)."""
        return self._message

    async def sync(self, partial: AssistantMessage, *, last: bool = False) -> None:
        """Show what ``partial`` gained since the last call (new blocks, appended text).

        Text is cleaned per piece, so a piece ending in ``\r`` waits for the next one (a
        ``\r\n`` split across two pieces must show as the newline it is, as when stored),
        until ``last``."""
        self._message = partial
        content = partial.content
        for index in range(len(content)):
            block = content[index]
            if index >= len(self._views):
                self._views.append(self._view_for(index, block))
                await self.mount(self._views[index])
            view = self._views[index]
            if isinstance(block, TextContent) and isinstance(view, LiveMarkdown):
                end = len(block.text) if last or not block.text.endswith("\r") else len(block.text) - 1
                new = block.text[self._seen[index] : end]
                if new:
                    self._seen[index] = end
                    await view.write(clean(new))
            elif isinstance(block, ThinkingContent) and isinstance(view, ThinkingView):
                if len(block.thinking) != self._seen[index]:
                    self._seen[index] = len(block.thinking)
                    view.set_thinking(block.thinking)
            elif (
                isinstance(block, ToolCall)
                and isinstance(view, ToolCallView)
                and block.arguments
                and view.status == "streaming"
            ):
                view.set_arguments(block.arguments)

    async def finish(self, final: AssistantMessage) -> None:
        """Show the persisted reply: remaining text, final arguments, stop reason and usage.

        The persisted reply may hold fewer blocks than were streamed (an aborted or failed
        reply drops the tool calls that will never run): their views are removed, so what
        is shown matches what was saved.
        """
        await self._match_blocks(final)
        await self.sync(final, last=True)
        for view in self._views:
            if isinstance(view, LiveMarkdown):
                await view.finish()
        for block in final.tool_calls:
            view = self.tool_views.get(block.id)
            if view is not None and view.status == "streaming":
                view.set_arguments(block.arguments)
        self.query_one(".who", Static).update(self._who(final))
        self.live = False
        footer = self._footer(final)
        if footer is not None:
            await self.mount(footer)

    async def _match_blocks(self, final: AssistantMessage) -> None:
        """Remove the views of streamed blocks ``final`` does not have.

        When ``final``'s blocks are the shown ones with some left out (the usual case: tool
        calls dropped), only those views go; otherwise every block view is rebuilt from
        ``final``.
        """
        keep: list[int] = []
        index = 0
        for block in final.content:
            while index < len(self._views) and not _shows(self._views[index], block):
                index += 1
            if index == len(self._views):
                keep = []
                break
            keep.append(index)
            index += 1
        if len(keep) != len(final.content):
            keep = []  # not a subsequence: rebuild every block from final
        if keep == list(range(len(self._views))):
            return
        kept = set(keep)
        for index, view in enumerate(self._views):
            if index in kept:
                continue
            if isinstance(view, ToolCallView):
                self.tool_views.pop(view.call_id, None)
            await view.remove()
        self._views = [self._views[i] for i in keep]
        self._seen = [self._seen[i] for i in keep]

    def on_markdown_link_clicked(self, event: Markdown.LinkClicked) -> None:
        event.stop()
        self.app.copy_to_clipboard(event.href)
        self.notify(f"Link not opened (copied to the clipboard): {clean(event.href)}", markup=False, timeout=8)

    def _view_for(self, index: int, block: Any) -> Widget:
        if isinstance(block, TextContent):
            # Links in model text are untrusted: a click shows the address instead of opening it.
            if self.live:
                # Starts empty and is filled by sync, so nothing is shown twice.
                self._seen.append(0)
                return LiveMarkdown(open_links=False)
            self._seen.append(len(block.text))
            return Markdown(clean(block.text), open_links=False)
        self._seen.append(0)
        if isinstance(block, ThinkingContent):
            self._seen[-1] = len(block.thinking)
            return ThinkingView(block.thinking)
        if isinstance(block, ToolCall):
            if self.live:
                status = "pending" if block.arguments else "streaming"
            else:
                status = "unanswered"  # until the transcript hands it its stored result
            view = ToolCallView(block, status=status)
            self.tool_views[block.id] = view
            return view
        return Static(literal(_raw_block(block), style="dim"))

    @staticmethod
    def _who(message: AssistantMessage) -> Text:
        who = Text()
        who.append("assistant", style="bold")
        if message.model_id:
            who.append(f" · {clean(message.model_id)}", style="dim")
        who.append(f"  {clock(message.timestamp)}", style="dim")
        return who

    @staticmethod
    def _footer(message: AssistantMessage) -> Static | None:
        reason = message.stop_reason
        if reason == "aborted":
            return Static(Text("⏹ aborted by the user"), classes="footer -aborted")
        if reason == "error":
            text = Text("✖ the model call failed: ")
            text.append_text(literal(message.error_message or "unknown error"))
            return Static(text, classes="footer -error")
        if reason == "length":
            return Static(Text("… cut off: the reply hit the output limit"), classes="footer")
        return None


class ToolResultView(Static):
    """A tool result whose call is not on screen (e.g. its assistant message is scrolled away)."""

    DEFAULT_CSS = """
    ToolResultView {
        height: auto;
        margin: 0 0 0 2;
        padding: 0 1;
        border-left: outer $success 60%;
        &.-error { border-left: outer $error; color: $text-error; }
    }
    """

    def __init__(self, message: ToolResultMessage) -> None:
        text = Text()
        text.append("↳ result of ", style="dim")
        text.append(clean(message.tool_name or "tool"), style="bold")
        text.append(f"  {clean(message.tool_call_id)}\n", style="dim")
        text.append_text(literal(content_text(message.content) or short_json(message.details, 2000)))
        super().__init__(text, classes="-error" if message.is_error else "")


class RawView(Static):
    """A row shown raw: a message of unknown role, or a row that could not be decoded."""

    DEFAULT_CSS = """
    RawView {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: outer $warning;
        color: $text-muted;
    }
    """

    def __init__(self, title: str, raw: str) -> None:
        text = Text()
        text.append(title, style="bold")
        text.append("\n")
        text.append_text(literal(raw[:4000]))
        super().__init__(text)


def _shows(view: Widget, block: Any) -> bool:
    """Whether ``view`` is the view :meth:`AssistantMessageView._view_for` made for ``block``."""
    if isinstance(block, TextContent):
        return isinstance(view, Markdown)
    if isinstance(block, ThinkingContent):
        return isinstance(view, ThinkingView)
    if isinstance(block, ToolCall):
        return isinstance(view, ToolCallView) and view.call_id == block.id
    return isinstance(view, Static)


def view_for_message(message: AnyMessage) -> Widget:
    """The view of one persisted message (tool results attach to their call instead, when shown)."""
    if isinstance(message, UserMessage):
        return UserMessageView(message)
    if isinstance(message, AssistantMessage):
        return AssistantMessageView(message)
    if isinstance(message, ToolResultMessage):
        return ToolResultView(message)
    return RawView(f"message with unknown role {clean(getattr(message, 'role', '?'))!r}", _dump(message))


def _dump(message: Any) -> str:
    try:
        return json.dumps(message.model_dump(mode="json"), ensure_ascii=False, indent=1, default=str)
    except Exception:
        return repr(message)


def _raw_block(block: Any) -> str:
    return f"[{clean(getattr(block, 'type', 'block'))} block] " + _dump(block)


def _raw_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(_raw_block(b) for b in content)
