"""A TCP proxy in front of the PostgreSQL server that can lose one commit's acknowledgement.

Armed, it forwards the next ``COMMIT;`` query (asyncpg's transaction commit, a simple
Query message) to the server, waits until the server answered it - so the transaction
is committed - and then closes both sides without passing the answer on: the client
sees its connection drop mid-commit, exactly as when a network fails after the server
committed. Loopback only; it stops with :meth:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib

_COMMIT = b"Q\x00\x00\x00\x0cCOMMIT;\x00"  # 'Q', int32 length 12, the query text with its NUL


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
        """Withhold the answer to the next COMMIT that passes through."""
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
        committing = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self._armed and _COMMIT in data:
                    self._armed = False
                    committing.set()
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                # The server's answer to COMMIT: CommandComplete "COMMIT" then ReadyForQuery.
                if committing.is_set() and b"COMMIT\x00" in data:
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
