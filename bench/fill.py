"""Stores filled fast for the benchmark: many threads, or one long thread, through the store API.

Every row goes through :meth:`core.checkpoint.sqlite.SQLiteCheckpointer.append` (so the
file is exactly what the app writes), in batches of :data:`BATCH` messages per call: one
transaction each, instead of one per message as an agent writes them.
"""

from __future__ import annotations

from pathlib import Path

from bench.bench_store import make_messages
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AnyMessage, AssistantMessage, TextContent, Usage, user_text

BATCH = 2_000
"""Messages per ``append`` call while filling (one transaction each)."""

THREAD_PREFIX = "bench-t"
"""Every filled thread's id starts with this; :func:`thread_id` gives the rest."""

FINAL_MARK = "final-answer-mark"
"""Words of the last message of every filled thread, for "the last message is painted"."""


def thread_id(index: int) -> str:
    """The id of the ``index``-th filled thread: ``bench-t00042``."""
    return f"{THREAD_PREFIX}{index:05d}"


def thread_messages(count: int, *, run_id: str = "run-1") -> list[AnyMessage]:
    """``count`` messages (at least 2): a prompt, then :func:`bench.bench_store.make_messages`'
    mix (reply with a tool call, tool output, prompt, ...), ending on a final assistant reply
    that holds :data:`FINAL_MARK`, so the thread reads completed."""
    if count < 2:
        raise ValueError("A filled thread has at least 2 messages: a prompt and a final reply.")
    body = make_messages(count - 1)
    if body[-1].role == "assistant":  # a reply with a tool call must be followed by its output
        body[-1] = user_text("Go on.", run_id=run_id)
    final = AssistantMessage(
        content=[TextContent(text=f"All steps are done; {FINAL_MARK}.")],
        stop_reason="stop",
        usage=Usage(input_tokens=2_000, output_tokens=20),
        provider_id="faux",
        model_id="faux-1",
        run_id=run_id,
    )
    return [*body, final]


async def fill_threads(path: Path, threads: int, per_thread: int, *, durable: bool = False) -> list[str]:
    """Create ``path`` holding ``threads`` threads of ``per_thread`` messages each; return
    their ids, the last written (the most recent) last. ``durable``: see ``SQLiteCheckpointer.open``."""
    messages = thread_messages(per_thread)
    ids = [thread_id(i) for i in range(threads)]
    store = await SQLiteCheckpointer.open(path, create=True, durable=durable)
    try:
        for tid in ids:
            await store.append(tid, messages)
    finally:
        await store.close()
    return ids


async def fill_long_thread(path: Path, count: int, tid: str | None = None, *, durable: bool = False) -> str:
    """Add one thread of ``count`` messages to ``path`` (created if missing) in batches of
    :data:`BATCH`; return its id (default: ``bench-long``)."""
    tid = tid or "bench-long"
    messages = thread_messages(count)
    store = await SQLiteCheckpointer.open(path, create=True, durable=durable)
    try:
        for start in range(0, len(messages), BATCH):
            await store.append(tid, messages[start : start + BATCH])
    finally:
        await store.close()
    return tid
