"""The App shell: opens the store, shows the picker, and moves between thread views.

Everything that runs or renders lives in the screens and widgets; the app only routes
``OpenThread`` / ``NewThread`` / ``CloseThread`` / ``RunFinished`` and keeps a thread's
screen alive while its agent runs, so leaving the view never stops a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from platformdirs import user_downloads_path
from textual import events, on, work
from textual.app import App, SystemCommand
from textual.screen import Screen

from core.errors import CubepiError, StoreConnectionError, error_sentence
from core.words import counted
from tui import hangup
from tui.actions import APP, bindings
from tui.keymap import UserKeymap
from tui.messages import (
    CloseThread,
    NeedsAttention,
    NewThread,
    OpenThread,
    RunFinished,
    RunStarted,
    StoreOpened,
    ThreadsLoaded,
)
from tui.palette import CommandPalette
from tui.screens.modals import ConfirmModal, ErrorScreen, HelpScreen, TextInputModal
from tui.screens.threads import ThreadsScreen
from tui.session import Session
from tui.widgets.status_bar import StatusBar

if TYPE_CHECKING:
    # Imported when a thread is first opened: its Markdown and transcript widgets took
    # 215 ms of the app's start to import and the picker needs none of them (issue 10).
    from tui.screens.thread import ThreadScreen

_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that end the app the way quitting does (runs aborted and saved); SIGHUP does
too, through :mod:`tui.hangup`, as the terminal is gone by then."""


def new_thread_id() -> str:
    """A fresh, sortable, readable thread id: ``20250101-120000-ab12``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


class CubepiApp(App[None]):
    """cubepi-tui: supervise agent threads stored in one database."""

    CSS_PATH = "app.tcss"
    TITLE = "cubepi-tui"

    BINDINGS = bindings(APP)

    def __init__(self, session: Session, *, thread_id: str | None = None, keymap: UserKeymap | None = None) -> None:
        """``keymap``: the user's keys (:mod:`tui.keymap`), applied as the app starts; its
        problem, if any, is shown as a notice."""
        super().__init__()
        self.user_keymap = keymap or UserKeymap()
        """The keymap file as read (``--keymap``, ``$CUBEPI_KEYMAP`` or the default file)."""
        self.session = session
        """The store, provider and agents this app drives."""
        self.start_thread_id = thread_id
        """A thread to open as soon as the store is open (``--thread``)."""
        self.threads_screen = ThreadsScreen(session)
        """The picker, always at the bottom of the screen stack."""
        self._thread_screens: dict[str, ThreadScreen] = {}
        self._restore_hangup: Callable[[], None] | None = None
        self._restore_signals: Callable[[], None] | None = None
        self._provider_asked = False
        self._help: HelpScreen | None = None  # made on the first ``?``, then kept
        self.fatal_error: str | None = None
        """The sentence of the error that kept the app from starting; quitting then exits 1."""

    def on_mount(self) -> None:
        if self.user_keymap.keys:
            self.set_keymap(dict(self.user_keymap.keys))
        if self.user_keymap.problem is not None:
            self.notify(self.user_keymap.problem, severity="warning", timeout=15, markup=False)
        self.session.report_to(on_busy=self._database_busy, on_status=self._store_notice_changed)
        self.push_screen(self.threads_screen)
        self._open_store()
        # A terminal closed (SIGHUP) or a `kill` (SIGTERM) should end like quitting: runs
        # aborted and saved, the terminal restored - not a thread left "crashed".
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError):  # not the main thread: the host handles signals
            self._restore_signals = hangup.on_termination(
                lambda signum: loop.call_soon_threadsafe(self._end_on_signal, signum),
                _ENDING_SIGNALS,
                watchdog=not self.is_headless,
            )
        with contextlib.suppress(ValueError, OSError):
            self._restore_hangup = hangup.on_hangup(
                lambda: loop.call_soon_threadsafe(self._end_on_signal, signal.SIGHUP), driver=lambda: self._driver
            )

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.InputEvent) and not event.is_forwarded:
            self.session.note_input()  # background refinement waits while the user is at work
        await super().on_event(event)

    def _end_on_signal(self, signum: int) -> None:
        """End as quitting does (runs aborted and saved), then exit with ``128 + signum``,
        the shell's convention for "ended by signal N" (129 SIGHUP, 130 SIGINT, 143 SIGTERM)."""
        self._abort_and_exit(128 + signum)

    @work(exclusive=True, exit_on_error=False, group="quit")
    async def _abort_and_exit(self, code: int) -> None:
        await self.session.stop_runs()
        self.exit(return_code=code)

    def _database_busy(self, attempt: int) -> None:
        self.notify(
            f"The database is locked by another program; waiting and retrying (attempt {attempt}).",
            severity="warning",
            timeout=3,
        )

    def _store_notice_changed(self) -> None:
        """Show ``session.store_notice`` ("reconnecting to …", or the connection given up on)
        in the picker's header and every thread screen's status bar, or clear it there."""
        notice = self.session.store_notice
        self.threads_screen.show_title()
        screens = {*self.screen_stack, *self._thread_screens.values()}
        for screen in screens:
            for bar in screen.query(StatusBar):
                bar.store = notice

    @work(exclusive=True, exit_on_error=False, group="store")
    async def _open_store(self) -> None:
        try:
            await self.session.open()
        except CubepiError as error:
            self.post_message(StoreOpened(error=str(error)))
            return
        self.post_message(StoreOpened())

    @on(StoreOpened)
    def _store_opened(self, message: StoreOpened) -> None:
        if message.error is not None:
            self.fatal_error = message.error
            self.push_screen(ErrorScreen(message.error, fatal=True))
            return
        # One listing at start: the watcher's first, when the store can be watched.
        if self.session.can_watch:
            self._watch_threads()
        else:
            self.threads_screen.reload()
            self._ask_provider()
        if self.start_thread_id is not None:
            self._open_thread(OpenThread(self.start_thread_id))
            self._ask_provider()

    def _ask_provider(self) -> None:
        """Have the provider built (once), then say if it could not be: after the first
        listing, so that building it (importing its SDK) never delays the thread list."""
        if not self._provider_asked:
            self._provider_asked = True
            self._prepare_provider()

    @work(exit_on_error=False, group="provider")
    async def _prepare_provider(self) -> None:
        await self.session.prepare_provider()
        if self.session.provider_error:
            hint = "You can still browse threads, but not run them (start with --demo to use the demo agent)."
            self.push_screen(ErrorScreen(self.session.provider_error, hint=hint))

    @work(exclusive=True, exit_on_error=False, group="watch")
    async def _watch_threads(self) -> None:
        """Keep the picker current: other programs' threads, runs elsewhere, expired leases."""
        failures = 0
        while True:
            try:
                async for update in self.session.watch_rows():
                    if failures:
                        self.session.set_store_notice("")  # a listing got through: the store is back
                    failures = 0
                    self.threads_screen.post_message(
                        ThreadsLoaded(rows=update.rows, changed=update.changed, listed=update.listed)
                    )
                    self._ask_provider()
                return
            except (CubepiError, OSError) as error:
                # A locked or vanished database, or a server gone past every reconnect: retry
                # slowly, so the picker comes back by itself; reloading by hand still works.
                if isinstance(error, StoreConnectionError):
                    self.session.set_store_notice(error_sentence(error))
                elif not failures and isinstance(error, CubepiError):
                    # Said once (the picker would otherwise wait silently); not again per retry.
                    self.threads_screen.post_message(ThreadsLoaded(error=str(error)))
                self._ask_provider()
                failures += 1
                await asyncio.sleep(min(0.5 * 2**failures, 10.0))

    async def on_unmount(self) -> None:
        await self.session.close()
        for restore in (self._restore_signals, self._restore_hangup):
            if restore is not None:
                restore()
        self._restore_signals = self._restore_hangup = None

    # --- navigation ---------------------------------------------------------------------

    @property
    def top_screen(self) -> Screen[object] | None:
        """The screen on top, or ``None`` while the app starts or shuts down (no screens)."""
        return self.screen_stack[-1] if self.screen_stack else None

    @on(OpenThread)
    def _open_thread(self, message: OpenThread) -> None:
        from tui.screens.thread import ThreadScreen

        screen = self._thread_screens.get(message.thread_id)
        if screen is None:
            screen = ThreadScreen(self.session, message.thread_id, prompt=message.prompt, new=message.new)
            self._thread_screens[message.thread_id] = screen
            # Installed, so popping it keeps it (and its run worker) alive.
            self.install_screen(screen, f"thread:{message.thread_id}")
        if screen is not self.top_screen:
            self.push_screen(screen)

    @on(NewThread)
    def _new_thread(self) -> None:
        self._ask_first_prompt()

    @work(exclusive=True, exit_on_error=False, group="input")
    async def _ask_first_prompt(self) -> None:
        prompt = await self.push_screen_wait(
            TextInputModal("New thread", "The first prompt of a new thread.", placeholder="What should the agent do?")
        )
        if prompt:
            self.post_message(OpenThread(new_thread_id(), prompt=prompt, new=True))

    @on(CloseThread)
    async def _close_thread(self, message: CloseThread) -> None:
        screen = self._thread_screens.get(message.thread_id)
        if screen is not None and self.top_screen is screen:
            await self.pop_screen()
        self._forget_if_idle(message.thread_id)
        if message.error is not None:
            self.push_screen(ErrorScreen(message.error))

    @on(RunStarted)
    def _run_started(self) -> None:
        self.threads_screen.reload()

    @on(RunFinished)
    def _run_finished(self, message: RunFinished) -> None:
        self._forget_if_idle(message.thread_id)
        self.threads_screen.reload()

    @on(NeedsAttention)
    def _needs_attention(self, message: NeedsAttention) -> None:
        """A watched thread started waiting for an answer or crashed: ring the bell and
        show the notice, as the session's ``config.alerts`` allow."""
        alerts = self.session.config.alerts
        if alerts.bell:
            self.bell()
        if alerts.notices:
            self.notify(message.sentence, severity="warning", timeout=10, markup=False)

    def _forget_if_idle(self, thread_id: str) -> None:
        """Drop a thread's screen once it is neither shown nor running, nor about to run (a
        prompt sent while it still loads the thread: the screen starts that run once loaded)."""
        screen = self._thread_screens.get(thread_id)
        if screen is None or screen in self.screen_stack or self.session.runs_here(thread_id):
            return
        del self._thread_screens[thread_id]
        self.uninstall_screen(screen)
        self.call_later(screen.remove)

    def thread_screen(self, thread_id: str) -> ThreadScreen | None:
        """The live screen of ``thread_id``, if one exists."""
        return self._thread_screens.get(thread_id)

    # --- quitting -----------------------------------------------------------------------

    async def action_quit(self) -> None:
        """Quit; when agents run here, ask first, then abort them so each ends cleanly."""
        if self.session.running_count():
            self._confirm_quit()
        else:
            self.exit(return_code=1 if self.fatal_error else 0)

    @work(exclusive=True, exit_on_error=False, group="quit")
    async def _confirm_quit(self) -> None:
        count = self.session.running_count()
        body = (
            f"{counted(count, 'agent is', 'agents are')} running in this app. Quitting aborts "
            f"{'it: it' if count == 1 else 'them: each'} saves what it "
            'has and its thread reads "aborted"; send a new message later to continue.'
        )
        queued = self.session.queued_count()
        if queued:
            body += f" {counted(queued, 'queued steer or follow-up', 'queued steers and follow-ups')} not delivered yet will be dropped."
        if await self.push_screen_wait(ConfirmModal("Quit cubepi-tui?", body, yes="Abort and quit")):
            self.notify("Aborting the running agents…")
            await self.session.stop_runs()
            self.exit()

    # --- commands -----------------------------------------------------------------------

    def action_command_palette(self) -> None:
        """Open the command palette (ours: see :mod:`tui.palette`)."""
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(CommandPalette(id="--command-palette"))

    def action_help(self) -> None:
        """Show the help screen: one kept (installed) screen, so showing it again neither
        composes nor lays out the help, nor the screen beneath, anew: a new HelpScreen's
        first resize laid out the picker behind it too, half of a ``?`` / Escape pair's
        CPU time at 10,000 threads (profiled with cProfile, issue 10)."""
        if isinstance(self.top_screen, HelpScreen):
            return
        if self._help is None:
            self._help = HelpScreen()
            self.install_screen(self._help, "help")
        self.push_screen(self._help)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Palette entries: the app's own actions first, then Textual's."""
        yield SystemCommand("New thread", "Start a new thread with a prompt", lambda: self.post_message(NewThread()))
        yield SystemCommand("Threads", "Back to the thread list", self._to_picker)
        yield SystemCommand("Reload threads", "Read the thread list again", self.threads_screen.reload)
        yield SystemCommand("Help", "Keys and crash points", self.action_help)
        yield from super().get_system_commands(screen)

    def deliver_screenshot(
        self, filename: str | None = None, path: str | None = None, time_format: str | None = None
    ) -> str | None:
        """Save a screenshot (the palette's "Screenshot"): into the user's downloads folder
        as Textual does, or into the working directory when that folder does not exist
        (Textual then only said "Failed to save screenshot", with no reason)."""
        if path is None and not user_downloads_path().is_dir():
            path = os.getcwd()
        return super().deliver_screenshot(filename, path, time_format)

    def _to_picker(self) -> None:
        from tui.screens.thread import ThreadScreen

        top = self.top_screen
        if isinstance(top, ThreadScreen):
            self.post_message(CloseThread(top.thread_id))


def make_app(session: Session, *, thread_id: str | None = None, keymap: UserKeymap | None = None) -> CubepiApp:
    """Build the app around ``session`` (``keymap``: the user's keys, see :mod:`tui.keymap`);
    the one factory used by the CLI, tests and screenshots."""
    return CubepiApp(session, thread_id=thread_id, keymap=keymap)
