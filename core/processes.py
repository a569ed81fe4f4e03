"""Running a child process from a tool, so that an abort ends it and everything it started.

A tool written the obvious way (``asyncio.create_subprocess_exec`` and ``await
proc.wait()``) keeps its child running after the run is aborted: cancelling the await
stops the waiting, not the process, and a grandchild the child started (a shell's
pipeline, a build's compiler) is never even signalled. Its side effects then land after
the run said "aborted".

:func:`run_process` starts the child in its own session, hence its own process group
(``start_new_session``: the group id is the child's pid), collects its output (stdout
and stderr merged, decoded as UTF-8 with ``surrogateescape``, so undecodable bytes are
kept exactly, see :mod:`core.checkpoint.codec`) and reports each line as progress. When
the run's abort signal is set it ends the whole group: ``SIGTERM``, then ``SIGKILL``
``term_grace`` seconds later if any process of the group is still there. The processes
of a call never outlive it: after the child exits, what it left running in its group is
ended the same way, and a cancelled call kills the group at once.

    @tool
    async def build(target: str, ctx: ToolContext) -> AgentToolResult:
        \"\"\"Build a target.\"\"\"
        return (await run_process(ctx, ["make", target])).tool_result()

Limits: a process that leaves the group (``setsid``, a double fork into a new session)
escapes it; and a process killed with SIGKILL itself cannot end its children (the group
then lives on until it ends or is killed by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.tools import AgentToolResult, ToolContext

ABORTED = "aborted after start; partial effects possible"
"""How the result of a process ended by an abort begins: it had started, so some of its
effects may have happened and must be checked."""

MAX_OUTPUT = 64 * 1024
"""Bytes of output kept by default; the rest is counted, not kept (a model reads the result)."""

_POLL = 0.01
"""Seconds between checks whether a process group is empty while it is being ended (no call
waits for a group; the checks last at most the grace)."""

_EXIT_POLL = 0.05
"""Seconds between checks whether the child exited, where no pidfd can say so at once."""

_REAP_POLL = 0.001
"""Seconds between checks for the child's exit status once its pidfd said it exited (the
event loop's child watcher reaps it a moment later)."""

_REPORT_CHARS = 200
"""Characters of the last output line shown as the tool's progress text."""

_PIPE_WAIT = 1.0
"""Seconds, at least, to wait for the output pipe to close once the group is gone."""

_LINE_LIMIT = 64 * 1024
"""Bytes of a line still without its newline kept for ``on_line`` (the rest of it is cut)."""


@dataclass(frozen=True, slots=True)
class ProcessOutcome:
    """How one child process ended.

    ``returncode``: the child's exit status (negative: ended by that signal), ``None`` when
    it could not be reaped. ``output``: stdout and stderr merged, decoded with
    ``surrogateescape``, at most ``max_output`` bytes of it (``dropped`` bytes more were
    read and not kept). ``aborted``: the run's abort ended it; ``killed``: SIGKILL had to
    be sent (SIGTERM was not enough within ``term_grace`` seconds).
    """

    argv: tuple[str, ...]
    returncode: int | None
    output: str
    dropped: int = 0
    aborted: bool = False
    killed: bool = False
    term_grace: float = 0.0
    label: str = ""

    def tool_result(self) -> AgentToolResult:
        """This outcome as a tool result: the output on success; an error result saying the
        exit status, the signal, or (aborted) :data:`ABORTED` and how the group was ended."""
        output = self.output + (f"\n[{self.dropped} more bytes of output not kept]" if self.dropped else "")
        details: dict[str, Any] = {"returncode": self.returncode, "aborted": self.aborted, "killed": self.killed}
        if self.aborted:
            how = f"SIGTERM, then SIGKILL after {self.term_grace:g} s" if self.killed else "SIGTERM"
            text = f"{ABORTED}: the process group of {self.shown} was ended ({how})."
            return AgentToolResult(_with_output(text, output), details=details, is_error=True)
        if self.returncode == 0:
            return AgentToolResult(output, details=details)
        if self.returncode is not None and self.returncode < 0:
            text = f"{self.shown} was ended by signal {_signal_name(-self.returncode)}."
        else:
            text = f"{self.shown} exited with status {self.returncode}."
        return AgentToolResult(_with_output(text, output), details=details, is_error=True)

    @property
    def shown(self) -> str:
        """How results name the process: ``label``, else the command line on one line, cut at 80."""
        if self.label:
            return self.label
        text = " ".join(" ".join(self.argv).split())
        return "`" + (text if len(text) <= 80 else text[:79] + "…") + "`"


async def run_process(
    ctx: ToolContext,
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    term_grace: float | None = None,
    max_output: int = MAX_OUTPUT,
    on_line: Callable[[str], None] | None = None,
    label: str = "",
) -> ProcessOutcome:
    """Run ``argv`` (no shell; pass ``["sh", "-c", line]`` for one) as the call ``ctx`` belongs to.

    The child gets no stdin (``/dev/null``) and its own process group. ``on_line(line)`` is
    called with every complete output line (decoded, without its newline); without it the
    last line of each chunk read is reported as the tool's progress text. ``label`` names
    the process in the result ("the trainer"; default: the command line). On the run's abort
    (``ctx.signal``) the group gets SIGTERM, and SIGKILL ``term_grace`` seconds later if any
    process of it is left; ``term_grace`` defaults to half of ``ctx.abort_grace``, so the
    group is gone and this result is returned before the executor cancels the call at the
    full grace (see :func:`core.tool_execution.execute_tool_calls`).

    Raises ``OSError`` when the program cannot be started (not found, not executable) and
    ``ValueError`` for an empty ``argv`` or a negative ``term_grace``. Cancelled, it kills
    the group (SIGKILL) before the cancellation goes on.
    """
    if not argv:
        raise ValueError("run_process needs a program to run (argv is empty).")
    grace = ctx.abort_grace / 2 if term_grace is None else term_grace
    if grace < 0:
        raise ValueError(f"term_grace is seconds and cannot be negative, not {grace!r}.")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    group = proc.pid  # start_new_session: the child leads a new session and process group
    sink = _Output(max_output, on_line, ctx)
    reader = asyncio.create_task(sink.read(proc.stdout), name=f"output of {argv[0]}")
    exited = asyncio.create_task(_exit_of(proc), name=f"exit of {argv[0]}")
    aborted = asyncio.create_task(ctx.signal.wait(), name=f"abort of {argv[0]}")
    killed = was_aborted = False
    try:
        await asyncio.wait({exited, aborted}, return_when=asyncio.FIRST_COMPLETED)
        was_aborted = ctx.signal.is_set() and not exited.done()
        # Aborted, or exited leaving processes in its group: end the group either way.
        killed = await end_group(group, grace, leader=exited)
        await exited
        # Every writer of the pipe in the group is gone: the reader reaches end-of-file,
        # unless a process that left the group holds it (then the output read so far is kept).
        await asyncio.wait({reader}, timeout=max(grace, _PIPE_WAIT))
    except BaseException:
        _signal_group(group, signal.SIGKILL)
        raise
    finally:
        aborted.cancel()
        for task in (reader, exited):
            if not task.done():
                task.cancel()
    return ProcessOutcome(
        tuple(argv),
        proc.returncode,
        sink.text(),
        sink.dropped,
        aborted=was_aborted,
        killed=killed,
        term_grace=grace,
        label=label,
    )


async def _exit_of(proc: asyncio.subprocess.Process) -> int:
    """The child's exit status, as soon as it is reaped. Not ``proc.wait()``: that also waits
    until every copy of its output pipe is closed, which a grandchild may hold open. A
    pidfd (Linux 5.3+) tells the exit at once; elsewhere the status is polled."""
    poll = _EXIT_POLL
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or the child is already gone
        pidfd = None
    if pidfd is not None:
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            if proc.returncode is None:
                await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        poll = _REAP_POLL
    # No pidfd (an old kernel) or a child that outlived it: nothing to wait on but the clock.
    while proc.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(poll)
    return proc.returncode


async def end_group(group: int, grace: float, *, leader: asyncio.Future[Any] | None = None) -> bool:
    """End process group ``group``: SIGTERM, then SIGKILL if a process of it is still there
    ``grace`` seconds later. Returns whether SIGKILL was sent; never raises for a group
    that is already gone.

    ``leader`` is the wait for the group's leader, when the caller started it: it must be
    reaped for the group to empty. A zombie left by a parent that never reaps counts as
    present only where there is no ``/proc`` (see :func:`_group_exists`).
    """
    if not _group_exists(group):
        return False
    _signal_group(group, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    pause = _POLL / 8  # most processes end within a few ms of SIGTERM: look soon, then less often
    while loop.time() < deadline:
        if (leader is None or leader.done()) and not _group_exists(group):
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 2, _POLL)
    if not _group_exists(group):
        return False
    _signal_group(group, signal.SIGKILL)
    return True


class _Output:
    """Collects a child's output: at most ``limit`` bytes kept, the rest counted; complete
    lines go to ``on_line``, or the last of each chunk to ``ctx`` as progress text."""

    def __init__(self, limit: int, on_line: Callable[[str], None] | None, ctx: ToolContext) -> None:
        self.limit = limit
        self.on_line = on_line
        self.ctx = ctx
        self.kept = bytearray()
        self.dropped = 0
        self._line = bytearray()

    async def read(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            room = max(self.limit - len(self.kept), 0)
            self.kept += chunk[:room]
            self.dropped += max(len(chunk) - room, 0)
            self._lines(chunk)

    def _lines(self, chunk: bytes) -> None:
        *complete, rest = (bytes(self._line) + chunk).split(b"\n")
        self._line = bytearray(rest[-_LINE_LIMIT:])  # a line without end is cut, never grows unbounded
        if self.on_line is not None:
            for line in complete:
                self.on_line(_decode(line))
            return
        shown = [line for line in complete if line.strip()]
        if shown:
            self.ctx.report(text=_decode(shown[-1]).strip()[:_REPORT_CHARS])

    def text(self) -> str:
        return _decode(bytes(self.kept))


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _group_exists(group: int) -> bool:
    """Whether a live (not zombie) process is in process group ``group``.

    Read from ``/proc`` where there is one: a process whose parent died is handed to
    pid 1, and a pid 1 that never reaps (some container inits) leaves zombies that
    ``killpg(group, 0)`` still finds although nothing runs. Elsewhere ``killpg`` decides.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        entries = None
    if entries is None:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):  # PermissionError: another user's group now
            return False
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # ended while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == group and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _with_output(text: str, output: str) -> str:
    return f"{text}\nOutput:\n{output}" if output else f"{text} It wrote no output."
