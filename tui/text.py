"""Untrusted text made safe to show, and small formatting helpers.

Every string that comes from a store, a model or a tool is untrusted: it may hold Rich
or Textual markup (``[bold red]``), terminal escape sequences (``\\x1b[31m``) or other
control characters that would repaint, hide or fake parts of the screen. The app shows
such strings only through :func:`literal` (a :class:`rich.text.Text`, never parsed as
markup) after :func:`clean` has replaced every character of the one rule,
:data:`core.untrusted.UNSAFE`, by a visible stand-in, so the user sees exactly what was
stored.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from rich.text import Text

from core.messages import ImageContent, TextContent
from core.untrusted import UNSAFE, escape


def _stand_in(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code < 0x20:
        # U+2400.. are the "control pictures": ESC shows as ␛, NUL as ␀, CR as ␍.
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"  # ␡
    return escape(char)


def clean(value: object) -> str:
    """Return ``value`` as text with every control character replaced by a visible stand-in.

    Newlines and tabs are kept; ``\\r\\n`` becomes ``\\n``. ESC becomes ``␛`` so an escape
    sequence such as ``\\x1b[31m`` shows as ``␛[31m`` instead of turning the screen red. A
    lone surrogate (an undecodable byte) shows as its escape, ``\\udcff``.
    """
    text = value if isinstance(value, str) else str(value)
    text = text.replace("\r\n", "\n")
    return UNSAFE.sub(_stand_in, text)


def literal(value: object, style: str = "") -> Text:
    """A Rich ``Text`` showing ``value`` exactly as stored: cleaned, never parsed as markup."""
    return Text(clean(value), style=style)


def one_line(value: object, limit: int = 80) -> str:
    """``value`` cleaned and squeezed onto one line, cut at ``limit`` characters with an ellipsis."""
    text = " ".join(clean(value).split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def short_json(value: Any, limit: int = 200) -> str:
    """Compact JSON for arguments and details, cleaned and cut at ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return one_line(text, limit)


def relative_time(when: float | None, now: float | None = None) -> str:
    """``when`` (unix seconds) as "just now", "5 min ago", "3 h ago", "2 d ago" or a date."""
    if when is None:
        return "unknown"
    delta = (time.time() if now is None else now) - when
    if delta < 45:
        return "just now"
    if delta < 3600:
        return f"{round(delta / 60)} min ago"
    if delta < 86400:
        return f"{round(delta / 3600)} h ago"
    if delta < 7 * 86400:
        return f"{round(delta / 86400)} d ago"
    return time.strftime("%Y-%m-%d", time.localtime(when))


def clock(when: float | None) -> str:
    """``when`` (unix seconds) as local ``HH:MM:SS``, or an empty string."""
    return "" if when is None else time.strftime("%H:%M:%S", time.localtime(when))


def content_text(content: object) -> str:
    """What a message's ``content`` reads as on screen (raw, still to be cleaned): its text
    blocks joined with newlines, and each image as ``[image image/png, 2,048 bytes]`` (the
    size decoded from its base64; an image with no data reads ``no data``). Other blocks
    are left to the caller; a plain string is returned as is."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent):
            size = len(block.data) * 3 // 4 - block.data[-2:].count("=") if block.data else 0
            what = f"{size:,} bytes" if size else "no data"
            parts.append(f"[image {block.mime_type or 'of unknown type'}, {what}]")
    return "\n".join(parts)
