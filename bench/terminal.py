"""The real app in a pseudo-terminal: its screen as a terminal would show it, and keys typed.

:class:`AppTerminal` starts a command (the app) on a pty of a fixed size, drains its output
on a reader thread into a :class:`Screen` (a small emulator of the sequences Textual's
Linux driver writes: cursor moves, erases, styles skipped, the alternate screen), and lets
the caller wait until the screen shows something, stamped with the time the bytes that
made it true were read. That is "painted" from the terminal's side: the frame reached the
terminal, whatever the app thinks it drew.

Keys are written as a terminal sends them. Escape is written as the kitty keyboard
protocol encodes it (``CSI 27 u``): Textual turns that protocol on at start, and a bare
ESC byte would add Textual's own disambiguation wait (``ESCDELAY``, 100 ms by default) to
every Escape, a constant of the terminal's encoding, not of the app's work.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import re
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rich.cells import cell_len, get_character_cell_size

ESCAPE = b"\x1b[27u"
"""Escape as the kitty keyboard protocol sends it (Textual enables it; see the module docstring)."""

ENTER = b"\r"

_TOKEN = re.compile(
    r"\x1b\[([0-9;:?<>=]*)([ -/]*)([@-~])"  # CSI: parameters, intermediates, final byte
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC up to BEL or ST
    r"|\x1b[PX^_][^\x1b]*\x1b\\"  # DCS / SOS / PM / APC strings
    r"|\x1b[()][0-9A-Za-z]"  # character set designation
    r"|\x1b."  # any other two-byte escape
    r"|[\r\n\b\x07\t]"
    r"|[^\x1b\r\n\b\x07\t]+"
)


class Screen:
    """A ``cols`` x ``rows`` character grid fed with terminal output (:meth:`feed`).

    Handles what Textual writes: CUP/HVP, relative cursor moves, CHA, ED, EL, CR, LF, BS,
    wide characters (two cells, by Rich's cell widths), the alternate screen (cleared on
    entry); styles (SGR), modes and queries are read and ignored. Output split anywhere,
    even inside an escape sequence, is handled: an unfinished sequence waits for the rest.
    """

    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.lines: list[list[str]] = [[" "] * cols for _ in range(rows)]
        self.x = self.y = 0
        self._rest = ""

    def feed(self, text: str) -> None:
        """Apply ``text`` (decoded output) to the grid."""
        text = self._rest + text
        self._rest = ""
        cut = text.rfind("\x1b")
        if cut != -1 and not _complete(text[cut:]):
            text, self._rest = text[:cut], text[cut:]
        for match in _TOKEN.finditer(text):
            token = match.group(0)
            if match.group(3) is not None:
                self._csi(match.group(1), match.group(3))
            elif token[0] == "\x1b":
                continue
            elif token == "\r":
                self.x = 0
            elif token == "\n":
                self.y = min(self.rows - 1, self.y + 1)
            elif token == "\b":
                self.x = max(0, self.x - 1)
            elif token in "\x07\t":
                continue
            else:
                self._put(token)

    def _put(self, text: str) -> None:
        line, x = self.lines[self.y], self.x
        if cell_len(text) == len(text):  # one cell per character: the common, fast case
            room = max(0, self.cols - x)
            line[x : x + min(room, len(text))] = text[:room]
            self.x = min(self.cols, x + len(text))
            return
        for char in text:
            width = get_character_cell_size(char)
            if width == 0 or x >= self.cols:
                continue
            line[x] = char
            if width == 2 and x + 1 < self.cols:
                line[x + 1] = ""
            x += width
        self.x = min(self.cols, x)

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?"):
            if final in "hl" and "1049" in params.split(";"):
                self.clear()
            return
        if params[:1] and params[0] in "<>=":  # private sequences (kitty keyboard, queries)
            return
        numbers = [int(p) if p.isdigit() else 0 for p in params.replace(":", ";").split(";")] if params else []

        def arg(i: int, default: int = 1) -> int:
            return numbers[i] if len(numbers) > i and numbers[i] else default

        if final in "Hf":
            self.y = min(self.rows, arg(0)) - 1
            self.x = min(self.cols, arg(1)) - 1
        elif final == "A":
            self.y = max(0, self.y - arg(0))
        elif final == "B":
            self.y = min(self.rows - 1, self.y + arg(0))
        elif final == "C":
            self.x = min(self.cols - 1, self.x + arg(0))
        elif final == "D":
            self.x = max(0, self.x - arg(0))
        elif final == "G":
            self.x = min(self.cols, arg(0)) - 1
        elif final == "J":
            mode = arg(0, 0)
            if mode == 0:
                self.lines[self.y][self.x :] = [" "] * (self.cols - self.x)
                for line in self.lines[self.y + 1 :]:
                    line[:] = [" "] * self.cols
            elif mode in (2, 3):
                self.clear(home=False)
        elif final == "K":
            mode = arg(0, 0)
            line = self.lines[self.y]
            if mode == 0:
                line[self.x :] = [" "] * (self.cols - self.x)
            elif mode == 1:
                line[: self.x + 1] = [" "] * (self.x + 1)
            else:
                line[:] = [" "] * self.cols

    def clear(self, *, home: bool = True) -> None:
        """Blank every cell (and move the cursor home)."""
        for line in self.lines:
            line[:] = [" "] * self.cols
        if home:
            self.x = self.y = 0

    def text(self) -> str:
        """The grid as lines of text (trailing blanks kept), joined by newlines."""
        return "\n".join("".join(line) for line in self.lines)


def _complete(tail: str) -> bool:
    """Whether ``tail`` (starting with ESC) holds a whole escape sequence."""
    if len(tail) < 2:
        return False
    if tail[1] == "[":
        return re.match(r"\x1b\[[0-9;:?<>=]*[ -/]*[@-~]", tail) is not None
    if tail[1] == "]":
        return "\x07" in tail or "\x1b\\" in tail[1:]
    if tail[1] in "PX^_":
        return "\x1b\\" in tail[1:]
    if tail[1] in "()":
        return len(tail) >= 3
    return True


Predicate = Callable[[str], bool]
"""A test of the screen's text (see :meth:`Screen.text`)."""


class AppTerminal:
    """``argv`` run on a new pseudo-terminal of ``cols`` x ``rows`` (its stdin, stdout and
    stderr), with ``env`` added to this process's environment and ``TERM`` set to
    ``xterm-256color``; its output drained into :attr:`screen` by a reader thread.

    Use as a context manager (the process is ended on exit: SIGTERM, then SIGKILL after
    ``grace`` seconds). Not thread-safe beyond the one reader thread it owns.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cols: int = 120,
        rows: int = 40,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        grace: float = 5.0,
    ) -> None:
        self.argv, self.cols, self.rows = list(argv), cols, rows
        self.env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows), **(env or {})}
        self.env.pop("TEXTUAL", None)  # no devtools or debug features from the caller's shell
        self.cwd, self.grace = cwd, grace
        self.screen = Screen(cols, rows)
        self.started_at = 0.0
        """``time.perf_counter()`` just before the process was started."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self._lock = threading.Condition()
        self._waiter: tuple[Predicate, list[float]] | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self.bytes_read = 0
        """Bytes the app wrote to the terminal so far."""
        self.reader_seconds = 0.0
        """Seconds the reader thread spent emulating the screen and testing predicates: the
        benchmark's own cost, which shares the machine with the app it measures."""

    def __enter__(self) -> AppTerminal:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        """The app's process id (raises ``RuntimeError`` before :meth:`start`)."""
        if self.proc is None:
            raise RuntimeError("The app has not been started.")
        return self.proc.pid

    def start(self) -> None:
        """Start the process on the pty and the reader thread."""
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # the pty becomes its controlling terminal, as in a terminal window
            close_fds=True,
        )
        os.close(slave)
        self._fd = master
        self._reader = threading.Thread(target=self._read, name="pty-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span two reads
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # EIO: the app closed the terminal (it exited)
                break
            if not chunk:
                break
            now = time.perf_counter()
            text = decoder.decode(chunk)
            with self._lock:
                self.bytes_read += len(chunk)
                self.screen.feed(text)
                waiter = self._waiter
                if waiter is not None and not waiter[1] and waiter[0](self.screen.text()):
                    waiter[1].append(now)
                    self._lock.notify_all()
                self.reader_seconds += time.perf_counter() - now
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def text(self) -> str:
        """The screen's text now."""
        with self._lock:
            return self.screen.text()

    def wait_for(self, predicate: Predicate, timeout: float) -> float | None:
        """Wait until the screen's text satisfies ``predicate``; return the ``perf_counter``
        time the output that made it true was read (at once if it already holds), or
        ``None`` after ``timeout`` seconds or when the app exited first."""
        with self._lock:
            if predicate(self.screen.text()):
                return time.perf_counter()
            found: list[float] = []
            self._waiter = (predicate, found)
            try:
                deadline = time.perf_counter() + timeout
                while not found and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return None
                    self._lock.wait(left)
                return found[0] if found else None
            finally:
                self._waiter = None

    def write(self, data: bytes) -> float:
        """Write ``data`` as typed keys; return the ``perf_counter`` time just before."""
        started = time.perf_counter()
        os.write(self._fd, data)
        return started

    def press(self, data: bytes, predicate: Predicate, timeout: float) -> float | None:
        """Type ``data`` and return the seconds until the screen satisfies ``predicate``
        (``None``: not within ``timeout`` seconds). The waiter is set before the bytes are
        written, so no frame can slip between them."""
        with self._lock:
            found: list[float] = []
            self._waiter = (predicate, found)
        try:
            started = self.write(data)
            with self._lock:
                deadline = started + timeout
                while not found and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return None
                    self._lock.wait(left)
                return found[0] - started if found else None
        finally:
            with self._lock:
                self._waiter = None

    def type_text(self, text: str, pause: float = 0.01) -> None:
        """Type ``text`` one character at a time, ``pause`` seconds apart (as a fast typist)."""
        for char in text:
            self.write(char.encode())
            time.sleep(pause)

    def close(self) -> None:
        """End the app (SIGTERM to its process group, SIGKILL after ``grace``) and the reader."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._reader is not None:
            self._reader.join(2)  # the app's end closed the pty's other side: the read ends
        if self._fd != -1:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` in bytes (``VmRSS`` of ``/proc/<pid>/status``).

    Raises ``OSError`` when the process is gone, ``ValueError`` when the line is missing."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/{pid}/status has no VmRSS line.")
