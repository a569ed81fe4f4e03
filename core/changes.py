"""Learn that a store changed, cheaply: the store's change signals as the trigger, the change token as the check.

Both supervision sides need this: the runner waits for commands, the app waits for what
a runner writes. The trigger is the store's own
:meth:`~core.checkpoint.capabilities.ChangeNotification.change_signals` (SQLite: a watch
on the file, which every commit of any process touches; memory: its own writes); a slow
timer is the fallback in case a signal is missed or the store cannot watch at all. Every
trigger is checked against ``store.change_token()`` (one pragma for SQLite), so a wakeup
that changed nothing - a WAL checkpoint, a connection coming or going - costs no reads.
Without the trigger (``signals=False``) the token alone is polled, quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Hashable

from core.checkpoint.capabilities import ChangeNotification
from core.errors import StoreConnectionError

_log = logging.getLogger(__name__)

_UNSET = object()


class StoreWatch:
    """Wait for changes of one store; see the module docstring.

    ``signals`` says whether to use the store's change signals as the trigger (``False``:
    poll the token only). ``step_ms`` is the signals' quiet period in milliseconds (for
    SQLite, 10 reacts in ~15 ms, 50 in ~80 ms). ``poll`` is the fallback period in
    seconds: 1.0 with signals, 0.05 without.

    Use it as an async context manager (or ``start``/``stop``) and call :meth:`wait`.
    """

    def __init__(
        self,
        store: ChangeNotification,
        *,
        signals: bool = True,
        step_ms: int = 50,
        poll: float | None = None,
    ) -> None:
        self.store = store
        self.signals = signals
        self.step_ms = step_ms
        self.poll = poll if poll is not None else (1.0 if signals else 0.05)
        self._kick = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._token: Hashable = _UNSET

    async def start(self) -> None:
        """Read the current token and start listening for signals; idempotent.
        Raises what ``store.change_token()`` raises."""
        if self._token is _UNSET:
            self._token = await self.store.change_token()
        if self.signals and self._task is None:
            self._stop.clear()
            self._task = asyncio.create_task(self._listen(), name=f"changes of {type(self.store).__name__}")

    async def stop(self) -> None:
        """Stop listening; never raises."""
        task, self._task = self._task, None
        self._stop.set()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def __aenter__(self) -> StoreWatch:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def kick(self) -> None:
        """Make a pending :meth:`wait` check the token now (e.g. after a write in this process)."""
        self._kick.set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Return ``True`` as soon as the store's change token differs from the last one seen,
        ``False`` when ``timeout`` seconds passed without a change (``None``: wait for one).

        Raises what ``store.change_token()`` raises (e.g. ``StoreBusyError``).
        """
        if self._token is _UNSET:
            await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = self.poll if deadline is None else min(self.poll, deadline - time.monotonic())
            if step > 0:
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives while
                # the kick is being set (it returns the finished inner wait instead), and a
                # follower's stop() then waits forever for a task that keeps following.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(step):
                        await self._kick.wait()
            self._kick.clear()
            token = await self.store.change_token()
            if token != self._token:
                self._token = token
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    async def _listen(self) -> None:
        try:
            async for _ in self.store.change_signals(self._stop, quiet_ms=self.step_ms):
                self._kick.set()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # The timer still checks the token every `poll` seconds: slower, never blind.
            # A server that stayed away is its one sentence (the traceback would only
            # repeat the driver's chain of socket errors); anything else is a bug to see.
            lost = isinstance(error, StoreConnectionError)
            _log.warning(
                "cannot watch %s for changes%s; checking every %.1f s instead",
                type(self.store).__name__,
                f" ({error})" if lost else "",
                self.poll,
                exc_info=not lost,
                extra={"store_error": error},
            )
