"""The headless runner's output lines: model and tool text can never drive the terminal."""

from __future__ import annotations

from core.runner import plain


def test_bidi_overrides_and_isolates_are_escaped_like_control_characters() -> None:
    assert plain("ok\u202egnp.exe\u2066x\u2069") == "ok\\u202egnp.exe\\u2066x\\u2069"
    assert plain("line\u2028sep") == "line\\u2028sep"
    assert plain("héllo wörld ✓") == "héllo wörld ✓"  # other non-ASCII text is kept
