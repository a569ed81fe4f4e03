"""A TCP proxy in front of a server (PostgreSQL or Redis) that can be cut and restored.

While it is up every byte passes both ways unchanged. :meth:`CutProxy.cut` closes every
connection it relays and stops listening, so the client sees its connections drop and
each new one refused (``ConnectionRefusedError``) - a server that went away, as far as the
client can tell, while the server itself (and every other test using it) carries on.
:meth:`CutProxy.restore` listens again on the same port. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from urllib.parse import urlsplit, urlunsplit


def through(url: str, port: int) -> str:
    """``url`` (``postgresql://user:pw@host:5432/db``, ``redis://host:6379/0?prefix=x``) with
    its host and port replaced by ``127.0.0.1:port``; user, password, path and query kept."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"))


class CutProxy:
    """Relay 127.0.0.1:``port`` (a free port, chosen by :meth:`start`) to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.relayed = 0
        """How many client connections were accepted and relayed so far."""

    @classmethod
    def to(cls, url: str) -> CutProxy:
        """A proxy to the server of ``url``."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 0)

    @property
    def is_cut(self) -> bool:
        return self._server is None

    async def start(self) -> int:
        """Listen on a free port; return it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def cut(self) -> None:
        """Stop listening (new connections are refused) and close every relayed connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, not a polite close: as a dropped link looks
        # Each relay ends by itself once its sockets are gone (cancelling asyncio's
        # connection callbacks would have asyncio log the cancellation as an error).
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    async def restore(self) -> None:
        """Listen on the same port again (``SO_REUSEADDR``, as asyncio sets on POSIX)."""
        assert self._server is None and self.port, "restore() only after start() and cut()"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self._server = await asyncio.start_server(self._serve, sock=sock)

    async def close(self) -> None:
        """Stop for good (as :meth:`cut`)."""
        await self.cut()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._server is None:  # accepted just as it was cut
            client_w.transport.abort()
            return
        self._tasks.add(task)
        self._writers.add(client_w)
        server_w: asyncio.StreamWriter | None = None
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
            self._writers.add(server_w)
            self.relayed += 1
            await _pump_both(client_r, client_w, server_r, server_w)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            for writer in (client_w, server_w):
                if writer is not None:
                    self._writers.discard(writer)
                    writer.transport.abort()


async def _pump_both(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    server_r: asyncio.StreamReader,
    server_w: asyncio.StreamWriter,
) -> None:
    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    pumps = [asyncio.ensure_future(pump(client_r, server_w)), asyncio.ensure_future(pump(server_r, client_w))]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for p in pumps:
            p.cancel()
        for p in pumps:
            with contextlib.suppress(BaseException):
                await p
