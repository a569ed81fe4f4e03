"""The headless runner: run one thread of a store under a Supervisor, from a shell.

    cubepi-tui run --db threads.sqlite --thread t1 "Summarise README.md"
    cubepi-tui run --db postgresql://me@dbhost/agents --thread t1 --resume --include-pending
    CUBEPI_DB=redis://localhost:6379/0 python -m core.runner run --thread t1 --demo "Try the demo"
    cubepi-tui delete --db threads.sqlite t1

The store is a SQLite file or a server URL (:mod:`core.checkpoint.locations`): ``--db``,
else the ``CUBEPI_DB`` environment variable, else the app's default SQLite file. It is
opened for one owner (:mod:`core.owners`): ``--owner NAME``, ``--unowned`` (threads that
record none, cubeloop's among them), else ``$CUBEPI_OWNER``, else the OS user. Another
owner's thread is answered exactly like a missing one
(:func:`core.checkpoint.base.thread_unavailable`).

``--workflow V`` names the version of the agent's workflow the thread records; a thread
written by another definition of the agent (system prompt, tools, model, workflow) is
refused in one sentence naming what changed, unless ``--accept-changes`` is given (the
override is recorded in the thread). A workflow version is checked like an owner name
(:func:`core.fingerprints.check_workflow`: not empty, at most 200 characters, no control
character; else exit 2). ``--start`` creates the thread with its first input idempotently
(``Agent.start``): run again with the same input it does not start twice; another first
input is always refused, ``--accept-changes`` or not (a thread id names one job: start it
under another thread id). A new thread's id may not hold a control character
(:func:`core.checkpoint.base.check_new_thread_id`, exit 2); a thread already stored under
one (cubeloop takes any id) runs as it is.

``delete THREAD`` removes one thread of this owner and everything stored for it
("Thread 't1' deleted."); it is refused while a run holds the thread's live lease, in the
app's words (:func:`core.checkpoint.base.not_deleted_sentence`).

The run holds the thread's lease (heartbeat every ``--heartbeat`` seconds; the lease names
this host as ``$CUBEPI_HOST_ID``, else the host name, see :func:`core.leases.host_id`), writes live
events and obeys abort / steer / follow-up commands sent from the app (or from
:func:`core.commands.send`), exactly as :class:`~core.supervisor.Supervisor` describes.
It prints one plain-text line per finished message to stdout (``user: ...``,
``assistant: ...``, ``tool NAME: ...``, ``steer: ...``), before a resume the plan it
carries out (``plan: Resume first settles each dangling call - fetch_dataset (c1):
started 17:00:40, never finished; step 2 of 8 committed at 17:00:43; ...``), one line per
retry wait of a model call (``model call: rate limited, retrying in 12 s (attempt 2 of
5)``) and a last line ``run OUTCOME``. Every line passes one escape (:func:`plain`, in the
one output path): control characters in model, provider, tool or stored text (a workflow
version, a host) are escaped, never sent to the terminal. While a server store reconnects, each attempt and the
recovery are one line on stderr (``store: reconnecting to postgresql://host/db (attempt
3, next in 0.8 s)…: ConnectionResetError: ...``).

Exit status: 0 completed (``delete``: deleted), 1 failed (or interrupted, or the database file was deleted or
replaced under the run, or another program kept it locked past the store's wait, or the
server stayed unreachable past every reconnect attempt: one
sentence on stderr), 130 aborted (an abort command,
Ctrl-C or SIGTERM), 2 bad input (one sentence on stderr: bad arguments or owner name, a
database that cannot be opened, a thread running elsewhere or unavailable to this owner,
nothing to resume, a changed agent definition without ``--accept-changes``, no API key).

The agent: ``--demo`` is the built-in demo (:mod:`core.demo`); otherwise Anthropic
(``ANTHROPIC_API_KEY``, ``--model``) with the demo's tools, as in the app; ``--agent
MODULE:FUNCTION`` names a function returning an :class:`AgentSpec` (your own model and
tools). This module never imports the app (``tui``), Textual or Rich.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import math
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from core.agent import Agent, check_user_text
from core.approvals import Approvals
from core.checkpoint.base import Checkpointer, PendingRequest, check_new_thread_id, thread_unavailable
from core.checkpoint.capabilities import FileBacked, SchemaUpgrade, ThreadDeletion, supports
from core.checkpoint.locations import ENV_VAR, chosen_location, describe_location, open_store
from core.checkpoint.reconnect import OnStatus, StoreStatus, reconnect_notice
from core.errors import (
    BadInput,
    CubepiError,
    DatabaseGoneError,
    StoreBusyError,
    StoreConnectionError,
    error_sentence,
)
from core.events import AgentEnd, AgentEvent, MessageEnd, MessageUpdate, RetryWait, RunOutcome
from core.fingerprints import check_workflow
from core.hitl import ApproveRequest, AskRequest, ConfirmRequest, RequestPayload, parse_request
from core.hitl_results import was_denied
from core.leases import LeaseHolder, delete_thread, deleted_sentence
from core.messages import AssistantMessage, ToolResultMessage, UserMessage
from core.owners import UNOWNED, check_owner, default_owner, resolve_owner
from core.providers.base import Provider
from core.providers.retry import retry_label
from core.recovery import ResumePlan
from core.supervisor import Supervisor
from core.tools import AgentTool
from core.untrusted import UNSAFE, escape

DEFAULT_MODEL = "claude-sonnet-4-5"
"""The Anthropic model used without ``--demo``, ``--agent`` or ``--model``."""

EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "interrupted": 1, "waiting": 3, "aborted": 130}
"""Exit status by run outcome; bad input exits 2. ``waiting`` (3): the run asked a person
and ended before an answer came; answering and then ``--resume`` goes on."""

BAD_INPUT = 2


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What ``--agent MODULE:FUNCTION`` returns: the model, its tools, the system prompt and
    each tool's approval rule (:mod:`core.approvals`; unlisted tools never ask)."""

    provider: Provider
    tools: Sequence[AgentTool] = field(default_factory=tuple)
    system_prompt: str = ""
    approvals: Approvals = field(default_factory=dict)


def chosen_owner(name: str | None, unowned: bool) -> str:
    """The owner named on a command line: :data:`core.owners.UNOWNED` for ``--unowned``,
    ``name`` for ``--owner NAME`` (checked: an empty ``--owner ""`` is refused, never read
    as unowned), else the default owner (``$CUBEPI_OWNER``, else the OS user). Raises
    ``BadInput`` with :mod:`core.owners`' one sentence for a name that cannot be an owner."""
    try:
        if unowned:
            return UNOWNED
        return check_owner(name) if name is not None else default_owner()
    except ValueError as error:
        raise BadInput(str(error)) from None


def add_owner_options(p: argparse.ArgumentParser) -> None:
    """Add ``--owner NAME`` and ``--unowned`` (mutually exclusive) to ``p``; read them with
    :func:`chosen_owner` (``args.owner``, ``args.unowned``). The app and the runner share them."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--owner",
        metavar="NAME",
        help="open the store for this owner: only its threads are listed, read and written "
        "(default $CUBEPI_OWNER, else your user name)",
    )
    group.add_argument(
        "--unowned",
        action="store_true",
        help="open the threads that record no owner (written by cubeloop or an older cubepi-tui)",
    )


async def run_headless(
    db_path: str | os.PathLike[str] | None,
    thread_id: str,
    prompt: str | None = None,
    resume: bool = False,
    demo: bool = False,
    *,
    owner: str | None = None,
    workflow: str | None = None,
    accept_changes: bool = False,
    start: bool = False,
    speed: float = 1.0,
    model: str | None = None,
    agent: str | Callable[[], AgentSpec] | None = None,
    include_pending: bool = False,
    create: bool = True,
    upgrade: bool = False,
    lease_ttl: float = 15.0,
    heartbeat_interval: float = 2.0,
    lock_wait: float | None = None,
    reconnect_wait: float | None = None,
    holder: LeaseHolder | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    handle_signals: bool = False,
) -> int:
    """Run ``thread_id`` of the store at ``db_path`` once and return the exit status.

    ``db_path`` is a SQLite path or a server URL (``postgresql://``, ``redis://``, ...: see
    :mod:`core.checkpoint.locations`); ``None`` means ``CUBEPI_DB``, else the default file.

    Exactly one of ``prompt`` (a new run on that user message) and ``resume`` (continue a
    crashed thread as ``Agent.plan_resume`` says, settling dangling calls by default) must
    be given; with ``start`` the prompt creates the thread idempotently (``Agent.start``).
    ``owner`` is who the store is opened for (``None``: the default owner; ``""``,
    :data:`core.owners.UNOWNED`: threads that record none); a thread of another owner is
    unavailable, as a missing one. ``workflow`` is the agent's workflow version the thread
    records; ``accept_changes`` goes on when the thread was written by another definition
    of the agent and records the override (without it that is refused, exit 2).
    ``include_pending`` sends steers and follow-ups a crashed runner never
    delivered with the run. ``agent`` is ``"MODULE:FUNCTION"`` or a callable returning an
    :class:`AgentSpec`; else ``demo`` (at ``speed``) or Anthropic (``model``).
    ``lease_ttl``/``heartbeat_interval`` are seconds; ``lock_wait`` is how long (seconds)
    each store call waits for a database another program keeps locked (default
    ``core.checkpoint.sqlite_file.LOCK_WAIT``; past it the run fails, exit 1; SQLite only);
    ``reconnect_wait`` is how long (seconds) each call to a server store retries a broken
    connection before the run fails (default and most about 26 s,
    ``core.checkpoint.reconnect.RECONNECT_DELAYS``; servers only); ``holder`` overrides who this
    process is to other runners (tests). Lines go to ``out``, the one-sentence error to
    ``err`` (default stdout/stderr). ``handle_signals`` makes SIGINT/SIGTERM abort the
    run (a second one cancels it). Never raises: bad input returns 2, a database deleted or
    replaced under the run, or locked past ``lock_wait``, or a server unreachable past every
    reconnect attempt (``StoreConnectionError``), returns 1 (failed).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    store = None
    quiet = _OneCause()
    chosen = chosen_location(db_path)
    where = describe_location(chosen.location)
    try:
        if (prompt is None) == (not resume):
            raise BadInput("Give either a prompt or --resume (exactly one of them).")
        if start and resume:
            raise BadInput("--start begins a thread with a prompt; it cannot be combined with --resume.")
        try:
            owner = resolve_owner(owner)
        except ValueError as error:
            raise BadInput(str(error)) from None
        if workflow is not None:
            try:
                check_workflow(workflow)
            except ValueError as error:
                raise BadInput(str(error)) from None
        if prompt is not None:
            check_user_text(prompt)
        if not thread_id.strip():
            raise BadInput("The thread id is empty.")
        spec = _agent_spec(agent, demo=demo, speed=speed, model=model)
        store = await open_store(
            chosen.location,
            create=create or chosen.default,
            make_parent=chosen.default,
            lock_wait=lock_wait,
            reconnect_wait=reconnect_wait,
            on_status=_status_printer(err, where),
            owner=owner,
        )
        quiet.store = store
        await upgrade_if_asked(store, where, upgrade, "running")
        if resume and await store.load(thread_id) is None:
            raise thread_unavailable(thread_id, owner)
        if not resume:
            try:
                check_new_thread_id(thread_id)
            except ValueError as error:
                if await store.load(thread_id) is None:  # a new thread: a stored one runs as it is
                    raise BadInput(str(error)) from None
        try:
            runner = Agent(
                spec.provider,
                store,
                thread_id,
                tools=spec.tools,
                system_prompt=spec.system_prompt,
                approvals=spec.approvals,
                workflow=workflow,
                holder=holder,
                lease_ttl=lease_ttl,
                heartbeat_interval=heartbeat_interval,
            )
        except ValueError as exc:
            raise BadInput(_flag_names(str(exc))) from None
        runner.subscribe(_printer(out))
        sup = Supervisor(runner, store)

        def say_plan(plan: ResumePlan) -> None:
            say(out, describe_plan(plan))

        restore = _abort_on_signals(sup) if handle_signals else (lambda: None)
        try:
            with _log_to(err, quiet):
                if resume:
                    outcome: RunOutcome = await sup.resume(
                        include_pending=include_pending, accept_changes=accept_changes, on_plan=say_plan
                    )
                elif start:
                    assert prompt is not None
                    outcome = await sup.start(
                        prompt, include_pending=include_pending, accept_changes=accept_changes, on_plan=say_plan
                    )
                else:
                    assert prompt is not None
                    outcome = await sup.prompt(prompt, include_pending=include_pending, accept_changes=accept_changes)
        finally:
            restore()
        # The last write may have gone into a file deleted after it committed.
        if supports(store, FileBacked):
            store.check_file()
        if quiet.lost is not None:
            # The server went away for good during the run (its writes' records were
            # dropped as accounts of this one cause): say it once.
            say(err, error_sentence(quiet.lost))
        if outcome == "waiting":
            pending = runner.state.pending_request
            question = f" ({pending.question})" if pending is not None else ""
            say(
                err,
                f"Thread {thread_id!r} waits for an answer{question}; answer it, then run it again with "
                f"--resume: {answer_hint(db_path, thread_id, owner, _payload_of(pending))}",
            )
        return EXIT_CODES.get(outcome, 1)
    except asyncio.CancelledError:
        say(err, "The run was cancelled.")
        return EXIT_CODES["aborted"]
    except Exception as exc:
        return ended_by(exc, err)
    finally:
        if store is not None:
            await store.close()


async def upgrade_if_asked(store: Checkpointer, where: str, upgrade: bool, doing: str) -> None:
    """Add cubepi-tui's own records to ``store`` (at ``where``, as
    :func:`~core.checkpoint.locations.describe_location` names it) when it needs them and
    ``upgrade`` (``--upgrade``) allows it; ``doing`` ends the refusal ("running",
    "deleting", ...). Raises ``BadInput`` when the store needs the upgrade and ``upgrade``
    is false: nothing is written then. A store without the ``SchemaUpgrade`` capability,
    or one that needs none, is left as it is."""
    if supports(store, SchemaUpgrade) and store.needs_upgrade:
        if not upgrade:
            raise BadInput(
                f"{where} was written by cubeloop or an older cubepi-tui; pass --upgrade to add "
                f"cubepi-tui's own records beside the existing ones (which are kept) before {doing}."
            )
        await store.upgrade()


async def delete_headless(
    db_path: str | os.PathLike[str] | None,
    thread_id: str,
    *,
    owner: str | None = None,
    upgrade: bool = False,
    reconnect_wait: float | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Delete ``thread_id`` of ``owner`` (``None``: the default owner; ``""``: unowned)
    from the store at ``db_path`` (as for :func:`run_headless`; never created here) and
    return the exit status: 0 deleted (one line on ``out``), 2 when the thread is missing
    or another owner's (the same sentence, :func:`core.checkpoint.base.thread_unavailable`),
    a run holds its live lease, or the store cannot be opened or is browse-only without
    ``upgrade``; 1 when the store failed meanwhile (locked past its wait, server gone).
    Never raises; the one sentence goes to ``err``."""
    out = out or sys.stdout
    err = err or sys.stderr
    store = None
    chosen = chosen_location(db_path)
    where = describe_location(chosen.location)
    try:
        if not thread_id.strip():
            raise BadInput("The thread id is empty.")
        try:
            owner = resolve_owner(owner)
        except ValueError as error:
            raise BadInput(str(error)) from None
        store = await open_store(
            chosen.location,
            create=False,
            reconnect_wait=reconnect_wait,
            on_status=_status_printer(err, where),
            owner=owner,
        )
        await upgrade_if_asked(store, where, upgrade, "deleting")
        if not supports(store, ThreadDeletion):
            raise BadInput(f"{where} cannot delete threads.")
        await delete_thread(store, thread_id)
        say(out, deleted_sentence(thread_id))
        return 0
    except Exception as exc:
        return ended_by(exc, err)
    finally:
        if store is not None:
            await store.close()


class _OneCause(logging.Filter):
    """Drops log records that are another account of the one cause the runner states in its
    one sentence: every record once the database file is gone (every write fails from then
    on), and every record whose exception is, or was caused by, a ``StoreConnectionError``
    (the server stayed unreachable past every reconnect: the heartbeat, the live events,
    the lease release all fail alike). ``lost`` is the first such error, for that sentence."""

    store: Checkpointer | None = None
    lost: StoreConnectionError | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        # ``store_error``: an error a record names without its traceback (core.changes).
        lost = _connection_lost(record.exc_info[1] if record.exc_info else record.__dict__.get("store_error"))
        if lost is not None:
            self.lost = self.lost or lost
            return False
        if not supports(self.store, FileBacked):
            return True
        try:
            self.store.check_file()
        except DatabaseGoneError:
            return False
        return True


def _connection_lost(error: BaseException | None) -> StoreConnectionError | None:
    """The ``StoreConnectionError`` that is ``error`` or its cause or context, if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, StoreConnectionError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def _log_to(err: TextIO, quiet: logging.Filter) -> Iterator[None]:
    """While the run goes, ``core``'s warnings go to ``err`` through ``quiet``, as Python's
    last-resort handler would print them (message only), unless the program configured
    logging itself (then its handlers get them, unchanged, and ``quiet`` only notes them:
    a server lost for good is still said in the runner's one sentence)."""
    logger = logging.getLogger("core")
    configured = bool(logging.getLogger().handlers)
    handler = _Noting() if configured else logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    handler.addFilter(quiet)
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = configured
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class _Noting(logging.Handler):
    """A handler that writes nothing: its filters see each record (and note what they need)."""

    def emit(self, record: logging.LogRecord) -> None:
        pass


def _agent_spec(
    agent: str | Callable[[], AgentSpec] | None, *, demo: bool, speed: float, model: str | None
) -> AgentSpec:
    if agent is not None:
        factory = _import_factory(agent) if isinstance(agent, str) else agent
        spec = factory()
        if not all(hasattr(spec, name) for name in ("provider", "tools", "system_prompt")):
            raise BadInput(f"{agent} did not return an AgentSpec (provider, tools, system_prompt).")
        return spec
    from core import demo as demo_agent

    tools = demo_agent.demo_tools(speed=speed)
    if demo:
        return AgentSpec(demo_agent.demo_provider(speed=speed), tools, demo_agent.SYSTEM_PROMPT)
    from core.providers.anthropic import AnthropicProvider

    return AgentSpec(AnthropicProvider(model=model or DEFAULT_MODEL), tools, demo_agent.SYSTEM_PROMPT)


def _import_factory(path: str) -> Callable[[], AgentSpec]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise BadInput(f"--agent takes MODULE:FUNCTION, not {path!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"Cannot import {module_name!r} for --agent: {exc}.") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadInput(f"{module_name} has no function {attr!r} for --agent.")
    return factory


def _abort_on_signals(sup: Supervisor) -> Callable[[], None]:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    hits = 0

    def on_signal() -> None:
        nonlocal hits
        hits += 1
        if hits == 1:
            sup.abort()
        elif task is not None:
            task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread, or a platform without it: Ctrl-C then just stops

    def restore() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return restore


# --- output --------------------------------------------------------------------------------

_KIND_LABELS = {"steer": "steer", "follow_up": "follow-up", "note": "note"}


def describe(message: Any) -> str | None:
    """The one line printed for a finished ``message`` (``None`` for none)."""
    if isinstance(message, UserMessage):
        kind = (message.metadata or {}).get("kind", "prompt")
        return f"{_KIND_LABELS.get(kind, 'user')}: {plain(message.text)}"
    if isinstance(message, AssistantMessage):
        parts = [f"assistant: {plain(message.text)}".rstrip()]
        calls = message.tool_calls
        if calls:
            parts.append(
                "[calls "
                + ", ".join(f"{c.name}({plain(json.dumps(c.arguments, ensure_ascii=False))})" for c in calls)
                + "]"
            )
        if message.stop_reason == "aborted":
            parts.append("(aborted)")
        elif message.stop_reason == "error":
            parts.append(f"(error: {plain(message.error_message or 'unknown')})")
        elif message.stop_reason == "length":
            parts.append("(cut off at the length limit)")
        return " ".join(parts)
    if isinstance(message, ToolResultMessage):
        verb = "denied" if was_denied(message.details) else "failed" if message.is_error else "returned"
        return f"tool {plain(message.tool_name or '?')} {verb}: {plain(message.text)}"
    return None


def answer_hint(
    db_path: str | os.PathLike[str] | None, thread_id: str, owner: str, payload: RequestPayload | None
) -> str:
    """The shell command that answers ``thread_id`` in the same store and for the same
    owner as this run, from any shell: ``--db`` when one was given (its password left out,
    as in every sentence: :func:`~core.checkpoint.locations.describe_location`), always
    ``--unowned`` or ``--owner NAME`` (``owner`` as resolved, so a ``$CUBEPI_OWNER`` of this
    shell is not needed there), each word quoted for a POSIX shell, then the first reply
    that fits ``payload`` and, in parentheses, the others (``None``: an unreadable request,
    ``--approve`` and the rest named only by ``--help``)."""
    words = ["cubepi-tui", "answer"]
    if db_path is not None:
        words += ["--db", describe_location(db_path)]
    words += ["--unowned"] if owner == UNOWNED else ["--owner", owner]
    words += ["--thread", thread_id]
    first, others = _replies_for(payload)
    return shlex.join(words) + f" {first}" + (f" (or {others})" if others else "")


def _payload_of(pending: PendingRequest | None) -> RequestPayload | None:
    """The payload of a pending request, ``None`` when there is none or it cannot be read."""
    if pending is None:
        return None
    try:
        return parse_request(pending.request_json).payload
    except CubepiError:
        return None


def _replies_for(payload: RequestPayload | None) -> tuple[str, str]:
    """The reply options of ``cubepi-tui answer`` that fit ``payload``: the first, the others."""
    if isinstance(payload, ApproveRequest):
        return "--approve", "--deny REASON, --edit JSON"
    if isinstance(payload, ConfirmRequest):
        return "--yes", "--no"
    if isinstance(payload, AskRequest) and len(payload.questions) == 1:
        return "--text TEXT", "--choice VALUE" if payload.questions[0].options else ""
    if isinstance(payload, AskRequest):
        return " ".join(f"--answer {shlex.quote(q.key)}=VALUE" for q in payload.questions), ""
    return "REPLY", "see cubepi-tui answer --help"


def describe_plan(plan: ResumePlan) -> str:
    """The line printed before a resume is carried out: ``"plan: "`` and the plan's
    sentence (:attr:`core.recovery.ResumePlan.sentence`: each dangling call, where it
    stopped - for a stepped tool "step 2 of 8 committed at 17:00:43" - and what is done
    with it, then what follows)."""
    return f"plan: {plan.sentence}"


def describe_wait(wait: RetryWait) -> str:
    """The line printed when a model call waits to be retried:
    ``"model call: rate limited, retrying in 12 s (attempt 2 of 5)"`` (the app's words,
    :func:`core.providers.retry.retry_label`; the reason escaped as :func:`plain` does)."""
    return "model call: " + retry_label(plain(wait.reason), wait.seconds, wait.attempt, wait.max_attempts)


def plain(text: str) -> str:
    """``text`` on one line with every character of :data:`core.untrusted.UNSAFE` escaped
    (``\\x1b``, ``\\u202e``, a lone surrogate as ``\\udcff``) and newlines and tabs as
    ``\\n`` and ``\\t``, so model or tool output can never drive the terminal."""
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    return UNSAFE.sub(lambda match: escape(match.group()), text)


def _printer(out: TextIO) -> Callable[[AgentEvent], None]:
    def on_event(event: AgentEvent) -> None:
        line: str | None = None
        if isinstance(event, MessageEnd):
            line = describe(event.message)
            if line is not None and not event.persisted:
                # The store did not take it (the run stops, saying why): not a finished message.
                line += " (not saved)"
        elif isinstance(event, MessageUpdate) and isinstance(event.delta, RetryWait):
            line = describe_wait(event.delta)
        elif isinstance(event, AgentEnd):
            line = f"run {event.outcome}" + (f": {event.error}" if event.error else "")
        if line is not None:
            say(out, line)

    return on_event


def _status_printer(err: TextIO, where: str) -> OnStatus:
    """``on_status`` for a server store: one line on ``err`` per reconnect attempt (with its
    reason, escaped as :func:`plain` does) and one when the store is back. Calls that wait
    out one outage together (a write, the heartbeat, the live events) each count their own
    attempts; attempt N is said by the first of them to reach it, so an outage reads as
    attempt 1, 2, 3... once each, as the README promises."""
    said = 0  # the highest attempt said since the store was last back

    def on_status(status: StoreStatus) -> None:
        nonlocal said
        if status.reconnecting:
            if status.attempt <= said:
                return
            said = status.attempt
        else:
            said = 0
        line = f"store: {reconnect_notice(where, status)}"
        say(err, f"{line}: {status.reason}" if status.reason else line)

    return on_status


def ended_by(error: Exception, err: TextIO) -> int:
    """End a headless command (``run``, ``delete``, ``answer``) that raised ``error``: one
    sentence on ``err`` and the exit status. 1 (failed) when the input was fine but the
    store was not: the database vanished, another program kept it locked past the store's
    wait (:data:`core.checkpoint.sqlite_file.LOCK_WAIT`), or the server stayed unreachable
    past every reconnect (:mod:`core.checkpoint.reconnect`); :data:`BAD_INPUT` (2) for any
    other :class:`~core.errors.CubepiError` (what was asked cannot be done); 1 for an
    internal error, still as one sentence, never a traceback."""
    if isinstance(error, (DatabaseGoneError, StoreBusyError, StoreConnectionError)):
        say(err, error_sentence(error))
        return EXIT_CODES["failed"]
    if isinstance(error, CubepiError):
        say(err, error_sentence(error))
        return BAD_INPUT
    say(err, f"Internal error: {error_sentence(error)}")
    return EXIT_CODES["failed"]


def say(stream: TextIO, line: str) -> None:
    """Write ``line`` and a newline to ``stream``: the one way the runner prints. The line
    passes :func:`plain` here, whatever it holds (model, tool or provider text, a thread id,
    an owner or workflow version from the store or the command line, an error's sentence),
    so nothing printed can drive the terminal."""
    try:
        stream.write(plain(line) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # a closed pipe must not stop the run, nor turn what was done into a traceback


# --- the command line ----------------------------------------------------------------------


def positive_number(text: str) -> float:
    """An argparse ``type``: ``text`` as a finite number above zero, else one sentence
    (``argparse.ArgumentTypeError``). A pace or a duration of zero would never end."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above zero, not {text!r}")
    return value


def _flag_names(sentence: str) -> str:
    """The Agent's own argument names in ``sentence`` replaced by this command's flags."""
    return sentence.replace("heartbeat_interval", "--heartbeat").replace("lease_ttl", "--lease-ttl")


class SentenceParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise ``BadInput`` with one sentence ("Unrecognized
    arguments: --x (see --help).") instead of printing the usage lines and exiting."""

    def error(self, message: str) -> Any:
        raise BadInput(f"{message[:1].upper()}{message[1:]} (see --help).")


def parser() -> argparse.ArgumentParser:
    """The ``run`` command's argument parser (``--help`` explains every option)."""
    p = SentenceParser(
        prog="cubepi-tui run",
        description="Run one thread headless, supervised: the app (or any process) can watch it live "
        "and abort, steer or follow it up through the store.",
    )
    p.add_argument("prompt", nargs="?", help="the user message that starts the run (omit with --resume)")
    p.add_argument(
        "--db",
        metavar="URL|PATH",
        help="the store of threads: a SQLite file, postgresql://user@host/db or redis://host:6379/0 "
        f"(created if missing; default ${ENV_VAR}, else the app's default SQLite file)",
    )
    p.add_argument("--thread", required=True, metavar="ID", help="the thread to run")
    add_owner_options(p)
    p.add_argument("--resume", action="store_true", help="continue a crashed thread instead of sending a prompt")
    p.add_argument(
        "--start",
        action="store_true",
        help="create the thread with this first prompt, idempotently: run again with the same prompt it "
        "does not start twice; another first prompt for the same thread id is always refused (use another "
        "thread id), --accept-changes or not",
    )
    p.add_argument(
        "--workflow",
        metavar="V",
        help="the version of your agent's workflow, recorded in the thread and compared on every later run "
        "(at most 200 characters, no control characters)",
    )
    p.add_argument(
        "--accept-changes",
        action="store_true",
        help="go on although the thread was written by another definition of the agent (system prompt, tools, "
        "model, workflow); the override is recorded in the thread (it never covers another first input)",
    )
    p.add_argument(
        "--include-pending",
        action="store_true",
        help="send steers and follow-ups a crashed runner never delivered with this run",
    )
    p.add_argument("--demo", action="store_true", help="use the built-in demo agent (no API key needed)")
    p.add_argument(
        "--speed",
        type=positive_number,
        default=1.0,
        metavar="X",
        help="demo pace multiplier (default 1; also --demo-speed, as in the app)",
    )
    # Its own action, so an error names the flag the user typed.
    p.add_argument("--demo-speed", dest="speed", type=positive_number, default=1.0, help=argparse.SUPPRESS)
    p.add_argument(
        "--model", metavar="NAME", help=f"Anthropic model (default {DEFAULT_MODEL}; needs ANTHROPIC_API_KEY)"
    )
    p.add_argument("--agent", metavar="MODULE:FUNCTION", help="a function returning a core.runner.AgentSpec")
    p.add_argument(
        "--lease-ttl",
        type=positive_number,
        default=15.0,
        metavar="S",
        help="seconds the thread's lease stays valid without a heartbeat (default 15)",
    )
    p.add_argument(
        "--heartbeat", type=positive_number, default=2.0, metavar="S", help="seconds between heartbeats (default 2)"
    )
    p.add_argument(
        "--reconnect-wait",
        type=positive_number,
        metavar="S",
        help="server stores: seconds a lost connection is retried before the run fails (default and most about 26)",
    )
    p.add_argument("--no-create", dest="create", action="store_false", help="fail if the store does not exist")
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="add cubepi-tui's tables (or keys) to a cubeloop (or older) store before running",
    )
    return p


def delete_parser() -> argparse.ArgumentParser:
    """The ``delete`` command's argument parser (``--help`` explains every option)."""
    p = SentenceParser(
        prog="cubepi-tui delete",
        description="Delete one thread of this owner and everything stored for it (messages, runs, "
        "journal, jobs, steps, commands, lease). Refused while a run holds the thread.",
    )
    p.add_argument("thread", metavar="THREAD", help="the id of the thread to delete")
    p.add_argument(
        "--db",
        metavar="URL|PATH",
        help=f"the store of threads, as for run (default ${ENV_VAR}, else the app's default SQLite file)",
    )
    add_owner_options(p)
    p.add_argument(
        "--reconnect-wait",
        type=positive_number,
        metavar="S",
        help="server stores: seconds a lost connection is retried before giving up (default and most about 26)",
    )
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="add cubepi-tui's tables (or keys) to a cubeloop (or older) store before deleting",
    )
    return p


COMMANDS = ("run", "delete")
"""The subcommands :func:`main` takes as its first argument (``run`` is the default)."""


def main(argv: Sequence[str] | None = None) -> int:
    """``cubepi-tui run ...`` / ``cubepi-tui delete ...`` / ``python -m core.runner [run|delete] ...``:
    parse, run (or delete), return the exit status.

    A leading ``run`` is accepted and skipped, so the app's CLI can pass its arguments as is;
    a leading ``delete`` deletes one thread (:func:`delete_headless`).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = "run"
    if args_list[:1] and args_list[0] in COMMANDS:
        command, args_list = args_list[0], args_list[1:]
    try:
        args = (parser() if command == "run" else delete_parser()).parse_args(args_list)
        owner = chosen_owner(args.owner, args.unowned)
    except BadInput as exc:
        say(sys.stderr, f"cubepi-tui {command}: {exc}")
        return BAD_INPUT
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if command == "delete":
        return asyncio.run(
            delete_headless(args.db, args.thread, owner=owner, upgrade=args.upgrade, reconnect_wait=args.reconnect_wait)
        )
    try:
        return asyncio.run(
            run_headless(
                args.db,
                args.thread,
                args.prompt,
                args.resume,
                args.demo,
                owner=owner,
                workflow=args.workflow,
                accept_changes=args.accept_changes,
                start=args.start,
                speed=args.speed,
                model=args.model,
                agent=args.agent,
                include_pending=args.include_pending,
                create=args.create,
                upgrade=args.upgrade,
                lease_ttl=args.lease_ttl,
                heartbeat_interval=args.heartbeat,
                reconnect_wait=args.reconnect_wait,
                handle_signals=True,
            )
        )
    except KeyboardInterrupt:  # Ctrl-C before the handlers were installed
        return EXIT_CODES["aborted"]


if __name__ == "__main__":
    sys.exit(main())
