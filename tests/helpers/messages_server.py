"""A loopback HTTP server speaking Anthropic's Messages API, for the official SDK to talk to.

    async with MessagesServer() as server:
        server.add(Stream(message_start(), *text_block(0, "Hi"), *message_end("end_turn")))
        provider = AnthropicProvider("claude-test-1", api_key="k", base_url=server.base_url)

Every request (``POST /v1/messages``) takes the next scripted response, in order:

* :class:`Stream`: a ``200`` ``text/event-stream`` response, each event sent as the
  ``event: <type>`` / ``data: <json>`` pair of the documented stream
  (https://platform.claude.com/docs/en/build-with-claude/streaming), in HTTP/1.1 chunks.
  A :class:`Hold` in the events stops sending until the client goes away (or the hold is
  released); a :class:`Cut` closes the connection in the middle of a chunk.
* :class:`Status`: an error response with the documented error body
  (``{"type": "error", "error": {"type", "message"}}``,
  https://platform.claude.com/docs/en/api/errors) and any headers (``retry-after``).

The event builders below produce the documented event shapes. The server listens on
127.0.0.1 on a free port and records each request (:class:`Received`) in ``requests``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# --- the documented events ------------------------------------------------------------------


def message_start(
    input_tokens: int = 25,
    *,
    output_tokens: int = 1,
    cache_read: int = 0,
    cache_write: int = 0,
    model: str = "claude-test-1",
    id: str = "msg_01",
) -> dict[str, Any]:
    """``message_start``: the empty message with the usage known so far (tokens)."""
    return {
        "type": "message_start",
        "message": {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": cache_write,
            },
        },
    }


def ping() -> dict[str, Any]:
    """``ping``: sent at any point of a stream; carries nothing."""
    return {"type": "ping"}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    """``content_block_start`` of ``block`` at content ``index``."""
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    """``content_block_delta`` for the block at ``index``."""
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict[str, Any]:
    """``content_block_stop`` of the block at ``index``."""
    return {"type": "content_block_stop", "index": index}


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    """A text block streamed as one ``text_delta`` per piece."""
    deltas = [block_delta(index, {"type": "text_delta", "text": p}) for p in pieces]
    return [block_start(index, {"type": "text", "text": ""}), *deltas, block_stop(index)]


def thinking_block(index: int, pieces: Sequence[str], signature: str) -> list[dict[str, Any]]:
    """A thinking block: ``thinking_delta`` per piece, then its ``signature_delta`` just
    before ``content_block_stop``, as the streaming page shows it."""
    deltas = [block_delta(index, {"type": "thinking_delta", "thinking": p}) for p in pieces]
    signed = block_delta(index, {"type": "signature_delta", "signature": signature})
    return [
        block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
        *deltas,
        signed,
        block_stop(index),
    ]


def tool_use_block(index: int, id: str, name: str, fragments: Sequence[str]) -> list[dict[str, Any]]:
    """A ``tool_use`` block whose input streams as ``input_json_delta`` fragments of
    partial JSON (the block starts with ``input: {}``, as documented)."""
    deltas = [block_delta(index, {"type": "input_json_delta", "partial_json": f}) for f in fragments]
    return [block_start(index, {"type": "tool_use", "id": id, "name": name, "input": {}}), *deltas, block_stop(index)]


def message_delta(stop_reason: str | None, output_tokens: int = 40, **usage: int) -> dict[str, Any]:
    """``message_delta``: the stop reason and the cumulative usage (tokens)."""
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens, **usage},
    }


def message_stop() -> dict[str, Any]:
    """``message_stop``: the stream's last event."""
    return {"type": "message_stop"}


def message_end(stop_reason: str, output_tokens: int = 40) -> list[dict[str, Any]]:
    """``message_delta`` then ``message_stop``."""
    return [message_delta(stop_reason, output_tokens), message_stop()]


def error_event(kind: str, message: str) -> dict[str, Any]:
    """An ``error`` event inside a 200 stream (e.g. ``overloaded_error``)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def text_stream(text: str, stop_reason: str = "end_turn", **start: Any) -> Stream:
    """A whole reply of one text block."""
    return Stream([message_start(**start), *text_block(0, text), *message_end(stop_reason)])


# --- scripted responses ---------------------------------------------------------------------


@dataclass
class Hold:
    """Stop sending here until the client closes the connection or :meth:`release` is called."""

    released: asyncio.Event = field(default_factory=asyncio.Event)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the stream got here (everything before was sent)."""

    def release(self) -> None:
        """Go on with the rest of the stream."""
        self.released.set()


@dataclass
class Cut:
    """Close the connection in the middle of a chunk: the stream is cut, not ended."""


@dataclass
class Stream:
    """A 200 event stream of ``events`` (dicts as built above, :class:`Hold`, :class:`Cut`).

    ``split`` sends each event in two chunks cut in the middle of its JSON, so the
    client's event decoder must join them. ``headers`` are added to the response.
    """

    events: Sequence[dict[str, Any] | Hold | Cut]
    split: bool = True
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Status:
    """An error response: HTTP ``status`` with the API's error body and ``headers``."""

    status: int
    kind: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)


Response = Stream | Status


@dataclass
class Received:
    """One request the server read: ``headers`` with lower-case names, ``body`` parsed JSON."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    529: "Overloaded",
}


class MessagesServer:
    """The server (see the module docstring); use it as ``async with``."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._script: deque[Response] = deque()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._arrived = asyncio.Condition()
        self.port = 0

    @property
    def base_url(self) -> str:
        """The URL to give the SDK as ``base_url``."""
        return f"http://127.0.0.1:{self.port}"

    def add(self, *responses: Response) -> None:
        """Append responses to the script."""
        self._script.extend(responses)

    @property
    def remaining(self) -> int:
        """Scripted responses not used yet."""
        return len(self._script)

    async def wait_for_requests(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` requests arrived (a liveness bound of ``timeout`` seconds)."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.requests) >= count), timeout)

    async def __aenter__(self) -> MessagesServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: that is its right
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # the client closed an idle connection
        lines = head.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        async with self._arrived:
            self.requests.append(Received(method, path, headers, json.loads(body) if body else None))
            self._arrived.notify_all()
        if not self._script:
            await _send_status(
                writer, Status(400, "invalid_request_error", "The test server has no scripted response left.")
            )
            return False
        response = self._script.popleft()
        if isinstance(response, Status):
            await _send_status(writer, response)
        else:
            await _send_stream(reader, writer, response)
        return False  # every response closes its connection ("connection: close")


async def _send_status(writer: asyncio.StreamWriter, status: Status) -> None:
    body = json.dumps(
        {"type": "error", "error": {"type": status.kind, "message": status.message}, "request_id": "req_test"}
    ).encode()
    headers = {"content-type": "application/json", "content-length": str(len(body)), **status.headers}
    writer.write(_head(status.status, headers) + body)
    await writer.drain()


async def _send_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stream: Stream) -> None:
    headers = {
        "content-type": "text/event-stream",
        "cache-control": "no-cache",
        "transfer-encoding": "chunked",
        **stream.headers,
    }
    writer.write(_head(200, headers))
    await writer.drain()
    for item in stream.events:
        if isinstance(item, Hold):
            item.reached.set()
            gone = asyncio.ensure_future(reader.read(1))  # b"" once the client closes
            released = asyncio.ensure_future(item.released.wait())
            try:
                await asyncio.wait({gone, released}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                released.cancel()
            if not item.released.is_set():
                return  # the client went away
            continue
        if isinstance(item, Cut):
            writer.write(b'400\r\nevent: content_block_delta\ndata: {"type": "content_blo')
            await writer.drain()
            transport = writer.transport
            transport.abort()  # no terminating chunk: the body is cut short
            return
        data = f"event: {item['type']}\ndata: {json.dumps(item)}\n\n".encode()
        parts = [data[: len(data) // 2], data[len(data) // 2 :]] if stream.split else [data]
        for part in parts:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", "connection: close", "request-id: req_test"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
