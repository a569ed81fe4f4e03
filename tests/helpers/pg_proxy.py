"""A TCP proxy in front of the PostgreSQL server that can lose one commit's acknowledgement.

Armed, it withholds the server's answer to the next statement that committed a
transaction and closes both sides instead: the client sees its connection drop mid-call,
exactly as when a network fails after the server committed. "Committed" is read off the
server's messages (protocol v3: a type byte and an int32 length): a CommandComplete that
is not a ROLLBACK (or a PortalSuspended, which ends a fetch of one row) followed by a
ReadyForQuery whose status is idle (``I``) - so both an
explicit ``COMMIT`` (asyncpg's transaction) and a single statement in its own implicit
transaction count, while a statement inside a transaction (ReadyForQuery ``T``), a
statement that failed (ErrorResponse, no CommandComplete) or a prepare (no
CommandComplete) do not. Loopback and cleartext only; it stops with :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib


class _Committed:
    """Reads the server's side of one connection and says when a commit's answer is in it."""

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._completed = False  # a CommandComplete (not ROLLBACK) since the last ReadyForQuery

    def feed(self, data: bytes) -> bool:
        """Take the next bytes from the server; whether they finish a commit's answer."""
        self._buffer += data
        if not self._started:
            self._started = True
            if self._buffer[:1] == b"N":  # the one-byte "no TLS" answer to asyncpg's SSLRequest
                self._buffer = self._buffer[1:]
        committed = False
        while len(self._buffer) >= 5:
            kind = self._buffer[:1]
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                break
            body, self._buffer = self._buffer[5 : 1 + length], self._buffer[1 + length :]
            if kind == b"C":
                self._completed = not body.startswith(b"ROLLBACK")
            elif kind == b"s":  # PortalSuspended: a fetch of one row (fetchval) ran its statement
                self._completed = True
            elif kind == b"Z":
                committed = committed or (self._completed and body == b"I")
                self._completed = False
        return committed


class CommitDropper:
    """Listen on 127.0.0.1 (a free port) and relay to ``host:port``; ``arm()`` drops one commit's answer."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._armed = False
        self.dropped = 0
        """How many commit answers were withheld (each one a committed transaction)."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Start listening; return the port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def arm(self) -> None:
        """Withhold the answer of the next commit that passes through."""
        self._armed = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self._target)
        answers = _Committed()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if answers.feed(data) and self._armed:
                    self._armed = False
                    self.dropped += 1
                    return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        for t in tasks:
            self._tasks.add(t)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
                self._tasks.discard(t)
            for w in (client_w, server_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
