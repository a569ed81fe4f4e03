"""Counting the message rows a store decodes (every backend decodes through :mod:`core.checkpoint.codec`;
the memory store, which keeps messages decoded, copies them out with ``copy_message`` instead).

Used by the listing tests (the rows a listing decodes must not grow with messages per
thread), the lazy thread view's tests, and by ``bench/bench_listing.py``, which prints the
same count beside its times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.checkpoint import codec, memory


@dataclass
class DecodeCount:
    """Rows decoded while :func:`counting_decodes` was active: ``rows`` message rows validated
    (one per row given to ``decode_rows``, one per call of ``decode`` / ``decode_value``
    outside it) or copied out of the memory store (one per ``copy_message``)."""

    rows: int = 0


@contextlib.contextmanager
def counting_decodes() -> Iterator[DecodeCount]:
    """Count every message row decoded through ``codec`` inside the block (its entry points
    are wrapped for its duration, then restored); yields the :class:`DecodeCount`."""
    count = DecodeCount()
    originals = {name: getattr(codec, name) for name in ("decode", "decode_value", "decode_rows")}
    inside = [0]  # decode_rows calls decode again for a row that fails: that row counts once

    def one(name: str) -> Any:
        original = originals[name]

        def counted(*args: Any, **kwargs: Any) -> Any:
            if not inside[0]:
                count.rows += 1
            return original(*args, **kwargs)

        return counted

    def rows(pairs: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(pairs)
        count.rows += len(pairs)
        inside[0] += 1
        try:
            return originals["decode_rows"](pairs, *args, **kwargs)
        finally:
            inside[0] -= 1

    copy = memory.copy_message

    def copied(message: Any) -> Any:
        count.rows += 1
        return copy(message)

    try:
        codec.decode = one("decode")  # type: ignore[method-assign]
        codec.decode_value = one("decode_value")  # type: ignore[method-assign]
        codec.decode_rows = rows  # type: ignore[method-assign]
        memory.copy_message = copied  # type: ignore[assignment]
        yield count
    finally:
        for name, original in originals.items():
            setattr(codec, name, original)
        memory.copy_message = copy  # type: ignore[assignment]
