"""Idempotency: each call of an idempotent tool is a *job* under a deterministic key.

Declare a tool idempotent when running it twice with the same arguments does no more
harm than running it once (the same file downloaded again, the same report rewritten)::

    @tool(idempotent=True)
    async def fetch(url: str, ctx: ToolContext) -> str: ...

    charge = idempotent(charge_card, key=lambda args: args["order_id"])

**The key.** :func:`job_key` is ``"<tool name>:" + sha256(canonical JSON of the
arguments)``, in hex. Canonical JSON is ``json.dumps(args, sort_keys=True,
separators=(",", ":"), ensure_ascii=False)``: key order and whitespace never matter, any
other difference in the arguments gives another key. The arguments are the
*validated* ones (defaults filled in), so ``{"n": 1}`` and ``{"n": 1, "step": 1}`` are
the same job when ``step`` defaults to 1. A custom ``key`` callable (see
:func:`idempotent`) receives those validated arguments and its string becomes
``"<tool name>:<your key>"``, so two tools never share a job.

**What the job store guarantees.** Before the work, ``job_begin(key)`` looks the key up
in the thread's store, atomically: a job already ``done`` returns its stored result and
the work is not done again. Otherwise the job is marked ``started`` and the work runs.
When it succeeds, ``job_finish(done, result)`` writes status and result in one
transaction, only *after* the work finished; when it fails (an exception, an error
result, or an abort during the work) the job is recorded ``failed`` and the next call
under the key runs the work again. A crash anywhere leaves the job ``started`` or
``failed``, never ``done`` without its result, so resume re-runs it.

**What it does not guarantee.** A side effect *outside* our database (a payment, an
e-mail, a row in another system) can happen and then the process can die before
``job_finish``: the job is still ``started`` and resume runs the work a second time.
Our store cannot make that exactly-once by itself. The tool must pass its key on to the
other system as that system's idempotency key (``ctx.job_key``; most payment and
messaging APIs accept one), so the second attempt is recognised there and does nothing.
A tool that cannot do that should not be declared idempotent: resume then records it
as interrupted and lets the user decide.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from core.checkpoint.base import JobRecord
from core.checkpoint.capabilities import Jobs as JobStore
from core.fingerprints import canonical_json as canonical_json  # re-exported: the key's JSON, documented above
from core.fingerprints import canonical_sha256

_log = logging.getLogger(__name__)


KeyFunction = Callable[[Mapping[str, Any]], str]
"""Builds a custom job key from a call's validated arguments (a JSON object)."""


def job_key(tool_name: str, args: Mapping[str, Any]) -> str:
    """The job key of a call of ``tool_name`` with ``args``: ``"<name>:<sha256 hex>"``.

    Deterministic across processes and versions of Python (see the module docstring).
    Arguments may hold lone surrogates (undecodable bytes read with ``surrogateescape``,
    e.g. a file name): they are hashed too, never an error.
    """
    # text_sha256 hashes a lone surrogate in its 3-byte form, which strict UTF-8 refuses;
    # every other text encodes exactly as with "strict", so no key that could be built before
    # changes, and distinct texts still give distinct bytes. (A high and a low surrogate held
    # as two code points give another key than the character they pair to; the store itself
    # reads such a pair back as that character, see core.checkpoint.codec.)
    digest = canonical_sha256(dict(args))
    return f"{tool_name}:{digest}"


class _Tool(Protocol):
    name: str
    idempotent: bool
    job_key_from: KeyFunction | None


T = TypeVar("T", bound=_Tool)


def idempotent(tool: T, *, key: KeyFunction | None = None) -> T:
    """A copy of ``tool`` declared idempotent, optionally keyed by ``key(arguments)``.

    The original is left as it was. ``key`` receives the call's validated arguments and
    returns a non-empty string; the job key is then ``"<tool name>:<that string>"``.
    Without ``key`` the job key is :func:`job_key` of the arguments. Raises
    ``TypeError`` when ``key`` is given but not callable.
    """
    if key is not None and not callable(key):
        raise TypeError("idempotent(): key must be a function of the arguments returning a string.")
    clone = copy.copy(tool)
    clone.idempotent = True
    clone.job_key_from = key
    return clone


def key_for(tool_name: str, args: Mapping[str, Any], key_from: KeyFunction | None = None) -> str:
    """The job key of one call: :func:`job_key`, or ``"<tool name>:" + key_from(args)``.

    Raises ``ValueError`` when ``key_from`` returns something other than a non-empty string.
    """
    if key_from is None:
        return job_key(tool_name, args)
    custom = key_from(args)
    if not isinstance(custom, str) or not custom:
        raise ValueError(f"The job key function of tool {tool_name!r} must return a non-empty string, not {custom!r}.")
    return f"{tool_name}:{custom}"


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """The JSON ``value`` a job produced, and whether it was ``reused`` (a done job: no work ran)."""

    value: Any
    reused: bool


Work = Callable[[], Awaitable[tuple[Any, bool]]]
"""The job's work: returns ``(JSON value, succeeded)``; only a success is stored as done."""


@dataclass(frozen=True, slots=True)
class Jobs:
    """One thread's jobs in ``store``: runs work at most once per key (see the module docstring).

    ``holder_id``: the lease holder whose run the jobs belong to; when given, every job
    write is fenced by it (``LeaseLostError`` once that holder lost the thread's lease).

    Calls under one key that overlap in time (two identical calls in one parallel batch)
    run one after the other: the second waits for the first, then finds its job done and
    reuses the result, or runs the work itself if the first did not succeed.
    """

    store: JobStore
    thread_id: str
    holder_id: str | None = None
    _running: dict[str, asyncio.Future[None]] = field(default_factory=dict, compare=False, repr=False)

    async def get(self, key: str) -> JobRecord | None:
        """The job under ``key``, or ``None``; the store's errors propagate."""
        return await self.store.job_get(self.thread_id, key)

    async def run(self, key: str, work: Work, *, tool_call_id: str | None = None) -> JobOutcome:
        """Return the stored value of a done job, else run ``work`` and record its outcome.

        ``work`` returns ``(value, succeeded)``: a success is stored as ``done`` with
        ``value`` (one transaction), anything else as ``failed``. An exception from
        ``work`` is recorded as ``failed`` with its text and re-raised. Errors of
        ``job_begin`` propagate (the work did not run; ``LeaseLostError`` among them). An
        error recording the outcome is logged, not raised: the caller still gets the
        value, and the job stays ``started``, so a later call runs the (idempotent) work again.
        """
        while (sibling := self._running.get(key)) is not None:
            # The job store only knows "started"; it cannot tell a job running now in this
            # process from one a crash left behind, so wait here for the live one to end.
            await asyncio.shield(sibling)
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[key] = finished
        try:
            record = await self.store.job_begin(self.thread_id, key, tool_call_id, **self._fence())
            if record.status == "done":
                return JobOutcome(record.result, reused=True)
            try:
                value, succeeded = await work()
            except Exception as exc:
                await self._finish(key, "failed", str(exc) or type(exc).__name__)
                raise
            await self._finish(key, "done" if succeeded else "failed", value)
            return JobOutcome(value, reused=False)
        finally:
            del self._running[key]
            finished.set_result(None)

    async def fail(self, key: str, reason: str) -> None:
        """Record the job under ``key`` as failed with ``reason`` (logged, never raised)."""
        await self._finish(key, "failed", reason)

    def _fence(self) -> dict[str, str]:
        # Unfenced calls pass no keyword, so a store that keeps no leases still works.
        return {} if self.holder_id is None else {"holder_id": self.holder_id}

    async def _finish(self, key: str, status: str, value: Any) -> None:
        try:
            await self.store.job_finish(self.thread_id, key, status, value, **self._fence())
        except Exception:
            _log.warning("could not record job %s of thread %s as %s", key, self.thread_id, status, exc_info=True)
