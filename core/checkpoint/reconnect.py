"""Riding out a lost server connection: one bounded backoff for every networked backend.

Postgres and Redis calls run through :func:`with_reconnect`. When the connection breaks
(server restart, ``pg_terminate_backend``, Redis ``CLIENT KILL``, a network blip) the call
is retried after ``RECONNECT_DELAYS`` - 0.1, 0.2, 0.4, 0.8, 1.6, 3.2 then 5 s four times,
about 26 s in all - which covers a local server's restart (a few seconds) and a failover,
yet ends a call to a server that is gone in under half a minute with one sentence
(:class:`~core.errors.StoreConnectionError`). Each retry tells ``on_status`` (the app
shows "reconnecting"); the first call through the same ``on_status`` that succeeds after
that tells it the store is back - also when the call that retried gave up or was
cancelled while it waited, so a "reconnecting" never outlives the outage.

A retried write must not be written twice: the backend makes each write idempotent
(a write id checked inside the same transaction or script), so a commit whose
acknowledgement was lost is found on retry instead of repeated.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from core.errors import StoreConnectionError

_log = logging.getLogger(__name__)

T = TypeVar("T")

RECONNECT_DELAYS: tuple[float, ...] = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0)
"""Seconds to wait before each retry of a call whose connection broke (sum: 26.3 s)."""


def delays_within(seconds: float) -> tuple[float, ...]:
    """:data:`RECONNECT_DELAYS` cut so they wait ``seconds`` in all: its first steps while
    they fit, then one shorter last step (``delays_within(2.0)`` is ``(0.1, 0.2, 0.4, 0.8,
    0.5)``). A wait of the whole 26.3 s or more gives :data:`RECONNECT_DELAYS` itself: the
    window is never made longer, as the backends remember a write's id for a bounded time
    past it (``postgres_conn.WRITE_ID_KEEP``, ``redis_keys.WRITE_MEMORY``). For a user who
    prefers a quick failure to riding out an outage (``cubepi-tui run --reconnect-wait``),
    and for tests. Raises ``ValueError`` unless ``seconds`` is a finite number above zero.
    """
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"The reconnect wait must be a number of seconds above zero, not {seconds!r}.")
    if seconds >= sum(RECONNECT_DELAYS):
        return RECONNECT_DELAYS
    chosen: list[float] = []
    for delay in RECONNECT_DELAYS:
        # Rounded to the microsecond, so 2.0 - (0.1 + 0.2 + 0.4 + 0.8) is 0.5, not 0.4999...
        left = round(seconds - sum(chosen), 6)
        if left <= 0:
            break
        chosen.append(min(delay, left))
    return tuple(chosen)


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """What a networked store tells its ``on_status`` callback.

    ``reconnecting`` is true while a call waits to retry (``attempt`` 1, 2, ... of
    ``len(RECONNECT_DELAYS)``, next try in ``delay`` seconds, ``reason`` the error in one
    line) and false once a call got through again (``attempt`` 0).
    """

    reconnecting: bool
    attempt: int = 0
    delay: float = 0.0
    reason: str = ""


OnStatus = Callable[[StoreStatus], None]

_unanswered: set[OnStatus] = set()
"""The callbacks told "reconnecting" and not yet told "back" (by equality: a store passes
the same callback to every call, so one store's calls share one entry)."""


async def with_reconnect(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    where: str,
    is_connection_error: Callable[[BaseException], bool],
    on_status: OnStatus | None = None,
    delays: Sequence[float] = RECONNECT_DELAYS,
) -> T:
    """Run ``call()`` (a fresh attempt each time: it must take its own connection) and
    retry it after each of ``delays`` while it fails with an error that
    ``is_connection_error`` accepts; other errors propagate at once.

    ``what`` names the operation and ``where`` the server (no password) for the one
    sentence of ``StoreConnectionError``, raised when the last retry failed too. The
    ``on_status`` callback must not raise (an exception from it is logged and ignored);
    it hears ``StoreStatus(False)`` on this call's success when this call or an earlier
    one through it was told "reconnecting" since it last heard "back".
    """
    attempt = 0
    while True:
        try:
            result = await call()
        except BaseException as error:
            if not is_connection_error(error):
                raise
            if attempt >= len(delays):
                raise StoreConnectionError(
                    f"Lost the connection to {where} and could not get it back in "
                    f"{sum(delays):.2g} s, so the {what} did not complete ({_one_line(error)})."
                ) from error
            delay = delays[attempt]
            attempt += 1
            if on_status is not None:
                _unanswered.add(on_status)
            _tell(on_status, StoreStatus(True, attempt, delay, _one_line(error)))
            await asyncio.sleep(delay)
            continue
        if on_status is not None and on_status in _unanswered:
            _unanswered.discard(on_status)
            _tell(on_status, StoreStatus(False))
        return result


def _tell(on_status: OnStatus | None, status: StoreStatus) -> None:
    if on_status is None:
        return
    try:
        on_status(status)
    except Exception:
        _log.exception("the store status callback failed")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def reconnect_notice(where: str, status: StoreStatus) -> str:
    """The words for ``status`` of the store at ``where`` (no password: a store's ``where``
    or :func:`core.checkpoint.locations.describe_location`), shared by the app and the
    runner: "reconnecting to postgresql://host/db (attempt 3, next in 0.8 s)…" while a
    call waits to retry, "reconnected to postgresql://host/db" once one got through."""
    if not status.reconnecting:
        return f"reconnected to {where}"
    return f"reconnecting to {where} (attempt {status.attempt}, next in {status.delay:.1f} s)…"
