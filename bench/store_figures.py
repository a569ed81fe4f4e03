"""Store figures in this process: listing, loading and appending, ours beside the peers.

* ``list_threads`` of our SQLite store over N threads (cubeloop 0.15.3 has no listing API);
* ``load`` of one N-message thread: ours, cubeloop's ``SQLiteCheckpointer.load`` of the
  same messages in its own file, and LangGraph's ``AsyncSqliteSaver.aget_tuple`` of a
  checkpoint whose ``messages`` channel holds the same N messages (LangChain messages,
  as LangGraph's ``add_messages`` keeps them);
* ``append`` of one message to a thread holding N rows, one call per message (as an agent
  persists at ``message_end``): ours, cubeloop's ``append``, and LangGraph's ``aput`` of
  the next checkpoint (LangGraph writes the whole channel value per step), at each side's
  shipped durability and at equal durability (both ``synchronous=FULL``, both WAL with
  ``synchronous=NORMAL``).

Each timing is one call, so medians and p95 are over calls. Every function takes its
sizes, so the smoke test runs them small. Nothing here asserts a speed.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.bench_backends import to_cubeloop
from bench.fill import fill_long_thread, thread_messages
from bench.peers import Durability, our_durability, pragmas, set_durability
from core.checkpoint.codec import gc_paused
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AnyMessage


async def _timed(call: Callable[[], Awaitable[Any]], repeat: int, check: Callable[[Any], None]) -> list[float]:
    """``repeat`` timings of ``call()`` in milliseconds; ``check`` sees each result.

    Each result is dropped before the next call: kept in ``result`` until the next one is
    assigned, it would be freed inside that call's timing (for a 10,000-message load, ~17
    ms of the next load's figure was freeing the previous load's messages)."""
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = await call()
        out.append((time.perf_counter() - started) * 1000)
        check(result)
        del result
    return out


# --- listing ----------------------------------------------------------------------------------


async def list_threads_ms(path: Path, threads: int, repeat: int = 7) -> list[float]:
    """Milliseconds of each of ``repeat`` ``list_threads`` calls on the store at ``path``,
    which holds ``threads`` threads (see :func:`bench.fill.fill_threads`). Raises
    ``RuntimeError`` when a listing has another number of threads."""
    async with await SQLiteCheckpointer.open(path, create=False) as store:

        def check(rows: list[Any]) -> None:
            if len(rows) != threads:
                raise RuntimeError(f"list_threads returned {len(rows)} threads of {threads}.")

        await store.list_threads()  # warm: the first statements are prepared once per connection
        return await _timed(store.list_threads, repeat, check)


# --- loading ----------------------------------------------------------------------------------


async def our_load_ms(directory: Path, messages: int, repeat: int = 9) -> tuple[list[float], Durability]:
    """Milliseconds of each of ``repeat`` ``load`` calls of one ``messages``-message thread
    of our SQLite store, and the store's durability. Raises ``RuntimeError`` on a short load."""
    path = directory / f"load-ours-{messages}.sqlite"
    if not path.exists():
        await fill_long_thread(path, messages, "load")
    async with await SQLiteCheckpointer.open(path, create=False) as store:
        durability = await our_durability(store)

        def check(data: Any) -> None:
            if data is None or len(data.messages) != messages:
                raise RuntimeError(f"our load returned {0 if data is None else len(data.messages)} of {messages}.")

        return await _timed(lambda: store.load("load"), repeat, check), durability


def parse_floor_ms(directory: Path, messages: int, repeat: int = 9) -> list[float]:
    """Milliseconds of each of ``repeat`` reads of the rows :func:`our_load_ms` loads, each
    row's JSON parsed into plain Python values (``pydantic_core.from_json``, the parser our
    validator uses) and nothing more: no validation, no models, no runs or journal, with the
    collector paused as our load pauses it. It is the floor under any ``load`` that hands
    back Python objects for every message; a target below it cannot be met by a faster
    decoder. Call it after :func:`our_load_ms` (it reads that file). Raises
    ``RuntimeError`` when the file holds another number of rows."""
    from pydantic_core import from_json

    path = directory / f"load-ours-{messages}.sqlite"
    out = []
    with sqlite3.connect(path) as c:
        for _ in range(repeat):
            started = time.perf_counter()
            with gc_paused():
                rows = c.execute("SELECT id, CAST(message_json AS BLOB) FROM messages ORDER BY id").fetchall()
                values = [from_json(raw) for _, raw in rows]
            out.append((time.perf_counter() - started) * 1000)
            if len(values) != messages:
                raise RuntimeError(f"the floor read {len(values)} rows of {messages}.")
            del rows, values
    return out


async def cubeloop_load_ms(directory: Path, messages: int, repeat: int = 9) -> tuple[list[float], Durability]:
    """The same for cubeloop's ``SQLiteCheckpointer.load`` on a file it wrote itself."""
    from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite

    path = directory / f"load-cubeloop-{messages}.sqlite"
    fresh = not path.exists()
    async with CubeloopSQLite(str(path)) as store:
        if fresh:
            await _seed_cubeloop(store, "load", thread_messages(messages))
        durability = await pragmas(store._db)  # cubeloop's connection: no public accessor

        def check(data: Any) -> None:
            if data is None or len(data.messages) != messages:
                raise RuntimeError(f"cubeloop's load returned {0 if data is None else len(data.messages)}.")

        return await _timed(lambda: store.load("load"), repeat, check), durability


async def _seed_cubeloop(store: Any, thread: str, messages: list[AnyMessage]) -> None:
    converted = to_cubeloop(messages)
    for start in range(0, len(converted), 500):
        await store.append(thread, converted[start : start + 500])


def to_langchain(messages: list[AnyMessage]) -> list[Any]:
    """Our messages as LangChain's (what LangGraph's ``messages`` channel holds): prompts as
    ``HumanMessage``, replies as ``AIMessage`` with ``tool_calls``, tool output as ``ToolMessage``."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for m in messages:
        text = "".join(getattr(b, "text", "") for b in m.content) if not isinstance(m.content, str) else m.content
        if m.role == "user":
            out.append(HumanMessage(content=text))
        elif m.role == "assistant":
            calls = [
                {"name": b.name, "args": b.arguments, "id": b.id, "type": "tool_call"}
                for b in m.content
                if getattr(b, "type", "") == "tool_call"
            ]
            out.append(AIMessage(content=text, tool_calls=calls))
        else:
            out.append(ToolMessage(content=text, tool_call_id=m.tool_call_id))
    return out


class LangGraphThread:
    """One LangGraph thread in an ``AsyncSqliteSaver``: checkpoints whose ``messages``
    channel is the whole conversation, the next one's parent the last (as a graph step writes)."""

    def __init__(self, saver: Any, thread: str) -> None:
        self.saver, self.thread = saver, thread
        self.config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        self.step = 0

    async def put(self, messages: list[Any]) -> None:
        """Write the next checkpoint, holding ``messages``."""
        from langgraph.checkpoint.base import empty_checkpoint

        self.step += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": self.step}
        self.config = await self.saver.aput(
            self.config, checkpoint, {"source": "loop", "step": self.step}, {"messages": self.step}
        )

    async def get(self) -> Any:
        """``aget_tuple`` of the thread's latest checkpoint."""
        return await self.saver.aget_tuple({"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}})


async def langgraph_load_ms(directory: Path, messages: int, repeat: int = 9) -> tuple[list[float], Durability]:
    """Milliseconds of each of ``repeat`` ``AsyncSqliteSaver.aget_tuple`` calls of a
    checkpoint holding ``messages`` messages, and the saver's durability."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = directory / f"load-langgraph-{messages}.sqlite"
    async with aiosqlite.connect(path) as conn:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        thread = LangGraphThread(saver, "load")
        if (await thread.get()) is None:
            await thread.put(to_langchain(thread_messages(messages)))
        durability = await pragmas(conn)

        def check(found: Any) -> None:
            got = len(found.checkpoint["channel_values"]["messages"]) if found is not None else 0
            if got != messages:
                raise RuntimeError(f"LangGraph's aget_tuple returned {got} messages of {messages}.")

        return await _timed(thread.get, repeat, check), durability


# --- appending --------------------------------------------------------------------------------


def _fresh(path: Path) -> Path:
    """``path`` with any earlier file there (and its WAL and journal) removed: an append
    figure is taken at exactly its history length, however often it is measured."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


async def our_append_us(
    directory: Path, history: int, appends: int, *, durable: bool = False
) -> tuple[list[float], Durability]:
    """Microseconds of each of ``appends`` one-message ``append`` calls to a thread of
    ``history`` rows in our store (``durable``: ``synchronous=FULL``), and its durability."""
    path = _fresh(directory / f"append-ours-{history}-{'full' if durable else 'normal'}.sqlite")
    await fill_long_thread(path, history, "long", durable=durable)
    extra = thread_messages(appends + 1)[:appends]
    async with await SQLiteCheckpointer.open(path, create=False, durable=durable) as store:
        durability = await our_durability(store)
        out = []
        for m in extra:
            started = time.perf_counter()
            await store.append("long", [m])
            out.append((time.perf_counter() - started) * 1e6)
    return out, durability


async def cubeloop_append_us(
    directory: Path, history: int, appends: int, *, wal_normal: bool = False
) -> tuple[list[float], Durability]:
    """The same for cubeloop's ``append`` on its own file: as shipped (rollback journal,
    ``synchronous=FULL``), or with ``wal_normal`` switched to WAL and ``synchronous=NORMAL``."""
    from cubeloop.checkpointer.sqlite import SQLiteCheckpointer as CubeloopSQLite

    path = _fresh(directory / f"append-cubeloop-{history}-{'normal' if wal_normal else 'shipped'}.sqlite")
    extra = to_cubeloop(thread_messages(appends + 1)[:appends])
    async with CubeloopSQLite(str(path)) as store:
        if wal_normal:
            await set_durability(store._db, wal=True, synchronous="NORMAL")
        await _seed_cubeloop(store, "long", thread_messages(history))
        durability = await pragmas(store._db)
        out = []
        for m in extra:
            started = time.perf_counter()
            await store.append("long", [m])
            out.append((time.perf_counter() - started) * 1e6)
    return out, durability


async def langgraph_append_us(
    directory: Path, history: int, appends: int, *, normal: bool = False
) -> tuple[list[float], Durability]:
    """Microseconds of each of ``appends`` ``aput`` calls, each the next checkpoint of a
    thread already holding ``history`` messages plus one more message (LangGraph keeps the
    conversation as one channel value); as shipped (WAL, ``synchronous=FULL``) or NORMAL."""
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = _fresh(directory / f"append-langgraph-{history}-{'normal' if normal else 'shipped'}.sqlite")
    conversation = to_langchain(thread_messages(history))
    extra = to_langchain(thread_messages(appends + 1)[:appends])
    async with aiosqlite.connect(path) as conn:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        if normal:
            await set_durability(conn, wal=True, synchronous="NORMAL")
        thread = LangGraphThread(saver, "long")
        await thread.put(conversation)
        durability = await pragmas(conn)
        out = []
        for m in extra:
            conversation = [*conversation, m]
            started = time.perf_counter()
            await thread.put(conversation)
            out.append((time.perf_counter() - started) * 1e6)
    return out, durability
