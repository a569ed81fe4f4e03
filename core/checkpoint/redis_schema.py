"""Our schema version in a Redis store, what a store under a prefix is, and the ordered migrations.

``MIGRATIONS[i]`` brings a store to schema version ``i + 1``; the version is the string
under ``{prefix}tui:schema``. A store without it is CubePi's example layout (version
``None``) when anything lies under the prefix, or nothing at all.

* v1: the listing index ``tui:threads`` (every thread of the example's layout, scored by
  its last message's ``timestamp``, 0 when unknown) and the schema version. Runs, the
  pending request, journal, jobs, leases, live events and commands need no migration:
  their keys appear when first written.
* v2: ``tui:first``, each thread's first user prompt, so a listing need not read and
  decode the head of every thread.
* v3: owners, revisions, fingerprints and tool steps. Every write from now on checks the
  thread's record ``tui:rec:{thread_id}`` (owner, created_at, fingerprints and their
  revision, overrides, the extra's revision) and creates it for a new thread; steps live in
  ``tui:steps:{thread_id}``; a named owner's index, leases and commands in keys of its own.
  The threads already stored - ours of v1/v2 and the example's - keep no record, which is
  what makes them unowned, and the keys of before (``tui:threads``, ``tui:leases``,
  ``tui:cmds``) become the unowned scope's, so nothing is rewritten: the step adds no key.
  What it changes is the version, and with it who may write: a cubepi-tui of v2 refuses
  the store as newer, so no program writes to it without checking owners.

A migration reads what it needs and returns the write commands; :func:`upgrade` runs
every pending step's commands and the new version in one ``MULTI``/``EXEC`` guarded by
``WATCH`` on the version key, so two programs upgrading at once migrate once, and a
failed upgrade writes nothing. A thread the example's code creates *during* an upgrade
may be missed by the index (``SCAN`` cannot see it); it still loads by id.

Only :mod:`core.checkpoint.redis` and its ``redis_*`` helpers import this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import WatchError

from core.checkpoint.redis_keys import CHANGES_KEEP, Keys
from core.checkpoint.redis_read import TAIL_WINDOW, first_prompt_of, message_time, scan_threads
from core.errors import DatabaseOpenError
from core.owners import UNOWNED

Command = tuple[Any, ...]
Migration = Callable[[Redis, Keys], Awaitable[list[Command]]]


async def _v1_thread_index(r: Redis, keys: Keys) -> list[Command]:
    """The listing index over the example's threads, by their last message's time (the
    unowned scope's index since v3: these threads record no owner)."""
    tids = sorted(await scan_threads(r, keys))
    pipe = r.pipeline(transaction=False)
    for tid in tids:
        pipe.lindex(keys.msgs(tid), -1)
    lasts = await pipe.execute() if tids else []
    return [
        ("ZADD", keys.index(UNOWNED), "NX", message_time(raw) or 0.0, tid) for tid, raw in zip(tids, lasts, strict=True)
    ]


async def _v2_first_prompts(r: Redis, keys: Keys) -> list[Command]:
    """Each thread's first user prompt, read from the head of its list (whole if need be)."""
    tids = sorted(await scan_threads(r, keys))
    pipe = r.pipeline(transaction=False)
    for tid in tids:
        pipe.lrange(keys.msgs(tid), 0, TAIL_WINDOW - 1)
    heads = await pipe.execute() if tids else []
    commands: list[Command] = []
    for tid, head in zip(tids, heads, strict=True):
        prompt = first_prompt_of(head)
        if prompt is None and len(head) == TAIL_WINDOW:
            prompt = first_prompt_of(await r.lrange(keys.msgs(tid), 0, -1))
        if prompt is not None:
            commands.append(("HSETNX", keys.first, tid, prompt))
    return commands


async def _v3_owners(_r: Redis, _keys: Keys) -> list[Command]:
    """Owners and revisions: nothing to rewrite (see the module docstring, v3). The records
    of v1/v2 (leases, jobs, commands) hold no revision and read as revision 1, runs as 1 or
    2 by their completion, extras as 0."""
    return []


MIGRATIONS: list[Migration] = [_v1_thread_index, _v2_first_prompts, _v3_owners]
"""Ordered migrations: applying ``MIGRATIONS[i]`` brings a store to schema version ``i + 1``.
Each must be safe on a store of the example's layout (add keys of ours, never change
``msgs:``/``extra:``). Append only; never reorder."""


def current() -> int:
    """The schema version this code writes (``len(MIGRATIONS)``, read at call time)."""
    return len(MIGRATIONS)


async def read_version(r: Redis, keys: Keys, where: str) -> int | None:
    """Our schema version in the store, ``None`` when it has none.

    Raises ``DatabaseOpenError`` when the version key holds something other than a number.
    """
    raw = await r.get(keys.schema)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DatabaseOpenError(
            f"The store at {where} under the prefix {keys.prefix!r} has a schema version this program cannot read ({raw!r})."
        ) from None


async def anything_under(r: Redis, keys: Keys) -> bool:
    """Whether any key lies under the prefix (one ``SCAN`` walk, stopped at the first key)."""
    async for _key in r.scan_iter(match=keys.pattern(""), count=1000):
        return True
    return False


async def create(r: Redis, keys: Keys) -> bool:
    """Record our schema version in an empty store; ``False`` when another program did first."""
    return bool(await r.set(keys.schema, current(), nx=True))


async def upgrade(r: Redis, keys: Keys) -> int:
    """Run the pending migrations and record the version, in one ``WATCH``ed transaction;
    return the version the store has afterwards (which may be newer, if another program was first)."""
    steps = MIGRATIONS
    async with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(keys.schema)
                raw = await pipe.get(keys.schema)
                version = int(raw) if raw is not None else 0
                if version >= len(steps):
                    await pipe.reset()
                    return version
                commands: list[Command] = []
                for step in steps[version:]:
                    commands.extend(await step(r, keys))
                pipe.multi()
                for command in commands:
                    pipe.execute_command(*command)
                pipe.set(keys.schema, len(steps))
                pipe.xadd(keys.changes, {"t": ""}, maxlen=CHANGES_KEEP, approximate=True)
                await pipe.execute()
                return len(steps)
            except WatchError:
                continue
