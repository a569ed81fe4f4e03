"""Tool steps: a long tool commits its progress, so re-running it continues from there.

An idempotent tool (its call has a job key, :mod:`core.jobs`) may split its work into
steps and commit after each one through ``ToolContext.steps`` (a :class:`StepLog`, or
``None`` when the store keeps no steps or the call has no job key). A commit writes the
number of steps done (``next_step``), ``revision + 1`` and the JSON ``data`` the step
produced in one compare-and-set transaction (``ToolSteps.step_commit``): a crash before
the commit leaves the earlier record exactly as it was. When resume re-runs the call
after a crash, the tool begins again, finds the record and runs only the steps after the
last committed one; once every step is committed, running it again changes nothing.

This is the lesson on resuming interrupted agents given to tools: a run row keeps the
``input`` fingerprint, a ``workflow`` version, ``next_step``, a ``revision`` and JSON
``data``; the same run requires the same input and workflow. :func:`run_steps` is the
lesson's loop::

    @tool(idempotent=True)
    async def count_words(text: str, ctx: ToolContext) -> str:
        return await run_steps(ctx.steps, [normalise, count], workflow="count-words/1", initial=text)

What a step does outside the store (a file written, a request sent) is not undone by a
crash before its commit: as for any idempotent tool, such a step must be safe to repeat
(pass ``ctx.job_key`` and the step number on as the other system's idempotency key).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.checkpoint.base import StepRecord
from core.checkpoint.capabilities import ToolSteps
from core.fingerprints import canonical_sha256

Step = Callable[[Any], Awaitable[Any] | Any]
"""One step: receives the data the previous step committed (or the initial data) and
returns the data to commit (a JSON value); sync or async."""


@dataclass(slots=True)
class StepLog:
    """The step record of one call of a stepped tool in ``store``.

    ``key`` is the call's job key, ``arguments`` its validated arguments (their canonical
    JSON's sha256 is the record's input fingerprint), ``holder_id`` the lease holder of the
    run (every write is fenced by it: ``LeaseLostError`` once the run lost its lease).
    ``record`` is the record as this log last read or wrote it (``None`` before
    :meth:`begin`). Methods raise what the store raises (see ``ToolSteps``).
    """

    store: ToolSteps
    thread_id: str
    key: str
    arguments: Mapping[str, Any]
    tool_call_id: str | None = None
    holder_id: str | None = None
    record: StepRecord | None = field(default=None)

    @property
    def input_fingerprint(self) -> str:
        """The sha256 hex of the call's arguments as canonical JSON."""
        return canonical_sha256(dict(self.arguments))

    async def begin(self, *, workflow: str, total_steps: int | None = None) -> StepRecord:
        """The call's step record: created at step 0, revision 0, when new; the stored one
        when the input fingerprint and ``workflow`` match (a re-run after a crash). Raises
        ``ConflictError`` when a record under this key holds another input or workflow,
        ``LeaseLostError``, ``ThreadNotFoundError`` (see ``ToolSteps.step_begin``)."""
        record = await self.store.step_begin(
            self.thread_id,
            self.key,
            input_fingerprint=self.input_fingerprint,
            workflow=workflow,
            total_steps=total_steps,
            tool_call_id=self.tool_call_id,
            **self._fence(),
        )
        self.record = record
        return record

    async def commit(self, next_step: int, data: Any) -> StepRecord:
        """Commit ``next_step`` steps done with ``data`` (JSON), compare-and-set on the last
        revision this log saw; returns the new record (revision one higher). Raises
        ``RuntimeError`` before :meth:`begin`, ``ValueError`` for a ``next_step`` below 0 or
        above the declared total, ``ConflictError`` when another writer committed since,
        ``TypeError`` for data JSON cannot hold, ``LeaseLostError``; nothing is written then."""
        current = self.record
        if current is None:
            raise RuntimeError(f"Step record {self.key!r} was never begun; call begin() first.")
        if next_step < 0 or (current.total_steps is not None and next_step > current.total_steps):
            raise ValueError(
                f"Step {next_step} is outside the {current.total_steps} steps of {self.key!r}."
                if current.total_steps is not None
                else f"Step {next_step} of {self.key!r} is below 0."
            )
        record = await self.store.step_commit(
            self.thread_id,
            self.key,
            expected_revision=current.revision,
            workflow=current.workflow,
            next_step=next_step,
            data=data,
            **self._fence(),
        )
        self.record = record
        return record

    def _fence(self) -> dict[str, str]:
        return {} if self.holder_id is None else {"holder_id": self.holder_id}


@dataclass(frozen=True, slots=True)
class StepLogs:
    """Makes the :class:`StepLog` of each call of one thread's run (the loop's view of the
    store's ``ToolSteps``; ``holder_id`` fences every write, as for jobs)."""

    store: ToolSteps
    thread_id: str
    holder_id: str | None = None

    def log(self, key: str, arguments: Mapping[str, Any], tool_call_id: str | None = None) -> StepLog:
        """The step log of the call with job ``key`` and validated ``arguments``."""
        return StepLog(self.store, self.thread_id, key, dict(arguments), tool_call_id, self.holder_id)


async def run_steps(
    log: StepLog | None,
    steps: Sequence[Step],
    *,
    workflow: str,
    initial: Any = None,
) -> Any:
    """Run the ``steps`` not yet committed in ``log`` in order, committing after each, and
    return the last one's data.

    Step ``n`` (1-based) receives step ``n - 1``'s committed data (``initial`` for the
    first). With a record that has ``k`` steps committed, steps ``k + 1`` on run with its
    data; with every step committed nothing runs and its data is returned (so running it
    again changes nothing). ``log`` ``None`` (no step store) runs every step without
    committing. ``workflow`` names the version of the steps: change it when they change,
    so an old record is refused (``ConflictError``) instead of being continued by other
    steps. Raises what a step raises (its commit is not made) and what
    :meth:`StepLog.begin` / :meth:`StepLog.commit` raise.
    """
    if log is None:
        data = initial
        for step in steps:
            data = await _run(step, data)
        return data
    record = await log.begin(workflow=workflow, total_steps=len(steps))
    data = record.data if record.next_step > 0 else initial
    for index in range(record.next_step, len(steps)):
        produced = await _run(steps[index], data)
        # Go on with what the store holds, so a run that continues after a crash and one
        # that never stopped hand the same value (as JSON reads it back) to the next step.
        data = (await log.commit(index + 1, produced)).data
    return data


async def _run(step: Step, data: Any) -> Any:
    result = step(data)
    return await result if inspect.isawaitable(result) else result
