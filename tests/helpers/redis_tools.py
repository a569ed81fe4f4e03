"""Tools for the Redis store's tests: CubePi's custom-backend example layout written and read
with cubeloop's own message classes, killing a store's connections (found by client name, or
by the process that holds them), and a proxy that loses one reply.

The example keeps each thread as two keys: ``RPUSH {prefix}msgs:{thread}`` of
``message.model_dump_json()`` and ``SET {prefix}extra:{thread}`` of the extra object's JSON;
its reader is ``LRANGE`` plus the message class's ``model_validate_json`` (by ``role``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from cubeloop.providers.base import AssistantMessage, ToolResultMessage, UserMessage

CUBELOOP_CLASSES: dict[str, Any] = {
    "user": UserMessage,
    "assistant": AssistantMessage,
    "tool_result": ToolResultMessage,
}


async def example_append(client: aioredis.Redis, prefix: str, thread_id: str, messages: list[Any]) -> None:
    """The example's ``append``: one RPUSH of each cubeloop message's ``model_dump_json()``."""
    await client.rpush(f"{prefix}msgs:{thread_id}", *(m.model_dump_json() for m in messages))


async def example_save_extra(client: aioredis.Redis, prefix: str, thread_id: str, extra: dict[str, Any]) -> None:
    """The example's ``save_extra`` (its read-modify-write: GET, merge, SET)."""
    key = f"{prefix}extra:{thread_id}"
    raw = await client.get(key)
    current = json.loads(raw) if raw else {}
    current.update(extra)
    await client.set(key, json.dumps(current))


async def example_load(client: aioredis.Redis, prefix: str, thread_id: str) -> tuple[list[Any], dict[str, Any]]:
    """The example's ``load``: LRANGE and cubeloop's ``model_validate_json`` per entry, GET of the extra."""
    raws = await client.lrange(f"{prefix}msgs:{thread_id}", 0, -1)
    messages = [CUBELOOP_CLASSES[json.loads(raw)["role"]].model_validate_json(raw) for raw in raws]
    extra = await client.get(f"{prefix}extra:{thread_id}")
    return messages, json.loads(extra) if extra else {}


async def kill_connections(client: aioredis.Redis, name_start: str) -> int:
    """``CLIENT KILL`` every connection whose name starts with ``name_start``; how many."""
    killed = 0
    for entry in await client.client_list():
        if entry.get("name", "").startswith(name_start):
            with contextlib.suppress(aioredis.ResponseError):
                killed += await client.client_kill_filter(_id=entry["id"])
    return killed


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets (Linux: its ``/proc/PID/fd`` socket
    inodes looked up in ``/proc/net/tcp`` and ``tcp6``); empty once it has ended."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def names_of_process(client: aioredis.Redis, pid: int) -> set[str]:
    """The client names (``CLIENT SETNAME``) of the connections process ``pid`` (on this
    machine) has open to the server, matched by the client side's port of each ``addr``."""
    ports = local_ports(pid)
    names = set()
    for entry in await client.client_list():
        port = int(entry.get("addr", ":0").rsplit(":", 1)[1])
        if port in ports and entry.get("name"):
            names.add(entry["name"])
    return names


class LostReplyProxy:
    """A TCP proxy to the Redis server that, once armed, forwards the next request holding
    ``marker`` (e.g. ``b"EVALSHA"``) to the server, waits for the server's reply, and then
    closes the client's connection without passing the reply on: the command ran, and its
    reply was lost on the way back. Every other byte passes through unchanged.
    """

    def __init__(self, host: str, port: int, marker: bytes) -> None:
        self.host, self.port, self.marker = host, port, marker
        self.armed = False
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self.listen_port = 0

    async def __aenter__(self) -> LostReplyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        dropping = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.armed and self.marker in data:
                    self.armed = False
                    dropping.set()
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                if dropping.is_set():
                    self.dropped += 1
                    return  # the reply reached us and goes no further
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()


@contextlib.asynccontextmanager
async def admin(url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client for the test's own reads and writes."""
    client = aioredis.from_url(url, socket_timeout=10)
    try:
        yield client
    finally:
        await client.aclose()
