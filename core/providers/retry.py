"""How long a provider waits before trying a failed model call again, and the wait itself.

Providers retry themselves (never inside an SDK) so that each wait is announced as a
:class:`~core.events.RetryWait` stream event the app can show, and so that an abort ends
the wait at once. This module holds the numbers and the header rules; it imports no SDK.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff for retryable failures (rate limits, overload, 5xx, lost connections).

    ``max_retries`` retries follow the first attempt. Without a server-given wait, retry
    *n* (1-based) waits ``min(initial_delay * 2 ** (n - 1), max_delay)`` seconds, less up
    to 25 % jitter: 0.5, 1, 2, 4 s (at most), 7.5 s over the four retries. These are the
    official Python SDK's numbers (``anthropic._constants``: ``INITIAL_RETRY_DELAY = 0.5``,
    ``MAX_RETRY_DELAY = 8.0``; jitter ``1 - 0.25 * random()`` in
    ``BaseClient._calculate_retry_timeout``); its default is 2 retries, ours 4, because a
    supervised run outlives a short overload and every wait here is shown and abortable.
    A server-given wait (``retry-after-ms`` or ``retry-after``, see :func:`retry_after`)
    is honoured as given when at most ``max_retry_after`` seconds; a longer one is not
    waited for (the call fails and says how long the server asked for).
    """

    max_retries: int = 4
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds before retry number ``retry`` (1 = the first) when the server gave no wait."""
        base = min(self.initial_delay * 2.0 ** max(retry - 1, 0), self.max_delay)
        return base * (1 - 0.25 * rand())


def retry_after(headers: Mapping[str, str] | None, now: Callable[[], float] = time.time) -> float | None:
    """The wait the server asked for, in seconds, or ``None`` when it asked for none.

    Read as the official SDK reads it (``BaseClient._parse_retry_after_header``):
    ``retry-after-ms`` (milliseconds, non-standard but more precise) first, then
    ``retry-after`` as seconds (a float is accepted), then ``retry-after`` as an HTTP date
    (RFC 9110 section 10.2.3). Anthropic's rate-limit page documents ``retry-after`` on
    429 responses (https://platform.claude.com/docs/en/api/rate-limits). A negative or
    unreadable value counts as none.
    """
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) / scale
        except ValueError:
            if name == "retry-after-ms":
                continue
            parsed = email.utils.parsedate_tz(raw)
            if parsed is None:
                return None
            seconds = email.utils.mktime_tz(parsed) - now()
        return seconds if seconds >= 0 else None
    return None


async def wait_or_abort(signal: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``signal`` is set first; return whether it was (an abort)."""
    if signal.is_set():
        return True
    try:
        await asyncio.wait_for(signal.wait(), timeout=max(seconds, 0.0))
    except TimeoutError:
        return False
    return True


def retry_label(reason: str, remaining: float, attempt: int, max_attempts: int) -> str:
    """What a retry wait reads as: ``"rate limited, retrying in 12 s (attempt 2 of 5)"``.

    ``remaining`` is in seconds (rounded up; none left reads "retrying now"); ``attempt``
    is the attempt that failed, so the one waited for is ``attempt + 1``. ``reason`` is
    used as given: the caller makes it safe to show.
    """
    when = f"in {math.ceil(remaining)} s" if remaining > 0 else "now"
    return f"{reason}, retrying {when} (attempt {attempt + 1} of {max_attempts})"
