"""The one rule for untrusted text: which characters never reach a terminal as they are.

Model, tool and stored text is untrusted: it may hold terminal escape sequences, other
control characters, or characters that reorder or split what is shown. Every place that
shows such text — the app (``tui/text.py``) and the headless runner (``core/runner.py``)
— replaces exactly the characters :data:`UNSAFE` matches, each with a visible stand-in
(at least :func:`escape`). This module imports nothing from ``core``.
"""

from __future__ import annotations

import re
import unicodedata

UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""C0 controls except tab and newline (ESC starts every escape sequence), DEL, C1 controls,
the line and paragraph separators, the bidi embeddings, overrides and isolates that can
visually reorder text (the "Trojan Source" characters, CVE-2021-42574), and lone
surrogates (undecodable bytes kept by ``errors="surrogateescape"``), which no terminal
encoding can print. Tab and newline are left to each caller."""


def escape(char: str) -> str:
    """``char`` as a Python-style escape: ``\\x1b`` below U+0100, else ``\\u202e``."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""The Unicode categories a name or version given by the user may not hold: controls,
format characters (the bidi overrides among them), lone surrogates, line and paragraph
separators. Such a name is refused when given, so it is never stored to be shown later."""


def holds_control(text: str) -> bool:
    """Whether ``text`` holds a character of :data:`CONTROL_CATEGORIES` (tab and newline count)."""
    return any(unicodedata.category(ch) in CONTROL_CATEGORIES for ch in text)
