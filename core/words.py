"""Counts in words: "1 tool call", "2 tool calls". This module imports nothing from ``core``."""

from __future__ import annotations


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` followed by ``one`` when ``n`` is 1, else by ``many`` (default ``one + "s"``):
    ``counted(1, "message")`` is ``"1 message"``, ``counted(3, "reply", "replies")`` is
    ``"3 replies"``, ``counted(0, "row")`` is ``"0 rows"``, ``counted(49984, "message")`` is
    ``"49,984 messages"`` (thousands separated, as the app writes every count). Never raises."""
    return f"{n:,} {one if n == 1 else (many if many is not None else one + 's')}"
