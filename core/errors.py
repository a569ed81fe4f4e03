"""One hierarchy of errors for the runtime; each class says when it is raised.

Every message is one sentence a user can act on: the app shows ``str(error)`` as is.
"""

from __future__ import annotations

from core.words import counted


class CubepiError(Exception):
    """Base of every error ``core`` raises on purpose."""


# --- providers ---------------------------------------------------------------------------


class ProviderError(CubepiError):
    """A model provider could not produce a reply (network, HTTP status, bad response).

    Providers normally report failures inside the stream as an assistant message with
    ``stop_reason="error"``; this is raised only where no stream exists yet.
    """


class MissingApiKeyError(ProviderError):
    """Raised by ``AnthropicProvider`` when no API key is given and ``ANTHROPIC_API_KEY`` is unset."""


# --- tools ---------------------------------------------------------------------------------


class ToolError(CubepiError):
    """Raised by a tool to report a failure; its message becomes the error tool result's text."""


class ToolDefinitionError(CubepiError):
    """Raised when ``@tool`` is applied to a function whose signature cannot become a schema."""


# --- storage ---------------------------------------------------------------------------------


class CheckpointError(CubepiError):
    """Base of every storage error."""


class DatabaseOpenError(CheckpointError):
    """The database cannot be opened: missing in a read-only place, not a database, or unreadable."""


class ThreadNotFoundError(CheckpointError):
    """The thread is unavailable to this store's owner: it has no messages, extra or runs, or
    it belongs to another owner. Both read the same sentence, made in one place
    (:func:`core.checkpoint.base.thread_unavailable`), so nothing tells them apart."""


class ConflictError(CheckpointError):
    """A compare-and-set write found another revision than it expected; nothing was written.

    ``thread_id`` names the thread, ``record`` what was written ("extra", "fingerprints",
    "command 7", "step job:ab12"), ``expected`` and ``actual`` the two revisions (``None``
    for a record that does not exist). Also raised when a record is created again with the
    same key but another input or workflow ("same run requires same input and workflow").
    """

    def __init__(
        self, message: str, *, thread_id: str, record: str, expected: int | None = None, actual: int | None = None
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.record = record
        self.expected = expected
        self.actual = actual


class CorruptRecordError(CheckpointError):
    """A stored row cannot be decoded (malformed JSON or a message that fails validation).

    ``thread_id`` and ``row_id`` locate the row; the row itself is never changed.
    """

    def __init__(self, message: str, *, thread_id: str, row_id: object) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.row_id = row_id


class SchemaError(CheckpointError):
    """The database schema is newer than this version knows, or needs a migration the user has not agreed to."""


class StoreBusyError(CheckpointError):
    """The database stayed locked by another process after every retry."""


class DatabaseGoneError(CheckpointError):
    """The database file was deleted, or replaced by another file, while a store had it
    open: SQLite keeps reading and writing the file it opened, which nothing can find
    again, so the store refuses every call from then on (raised by the SQLite store)."""


class StoreConnectionError(CheckpointError):
    """The database server could not be reached, or the connection kept breaking, after
    every reconnect attempt (:mod:`core.checkpoint.reconnect`); nothing of the failed call
    is known to be written unless its docstring says how it checks."""


class ReadOnlyStoreError(CheckpointError):
    """A write was attempted on a store opened for browsing only."""


class CommandTransitionError(CheckpointError):
    """Raised by ``update_command`` when the command's current status does not allow the
    move (it was settled meanwhile, e.g. discarded from another window); nothing changed,
    and ``command`` is the command as stored."""

    def __init__(self, message: str, *, command: object = None) -> None:
        super().__init__(message)
        self.command = command


# --- runs -------------------------------------------------------------------------------------


class RunError(CubepiError):
    """Base of the errors about starting, resuming or controlling a run."""


class RunAlreadyClaimedError(RunError):
    """Raised by ``claim_run`` when this run id is already claimed, and by ``acquire_lease``
    when another holder runs the thread; ``lease`` is then the live lease (else ``None``)."""

    def __init__(self, message: str, *, lease: object = None) -> None:
        super().__init__(message)
        self.lease = lease


class HostIdError(RunError):
    """Raised by ``core.leases.host_id`` when ``CUBEPI_HOST_ID`` is set to something that
    cannot name a host in lease records (a control character, or longer than
    ``core.leases.HOST_ID_MAX`` characters)."""


class RunAlreadyCompletedError(RunError):
    """Raised when a message is appended to, or a claim is made for, a run that already completed."""


class LeaseLostError(RunError):
    """Raised by a fenced write (one given ``holder_id=``) when the thread's lease is not
    held by that holder or has expired; nothing was written. ``why`` says which, in a
    few words ("it expired without a heartbeat", ...)."""

    def __init__(self, message: str, *, why: str = "") -> None:
        super().__init__(message)
        self.why = why


class RunNotClaimedError(RunError):
    """Raised by ``mark_run_complete`` for a run id that was never claimed."""


class AgentBusyError(RunError):
    """Raised when ``prompt()`` or ``resume()`` is called while this agent is already running."""


class EmptyMessageError(RunError):
    """Raised by ``prompt()``, ``steer()`` and ``follow_up()`` (and the runner, before it
    opens anything) when the text is empty or only whitespace: such text is never sent."""


class NothingToResumeError(RunError):
    """Raised by ``resume()`` on a thread that is completed, empty or waiting for a new user message."""


class ResumeChoiceError(RunError):
    """Raised by ``resume(choices)`` when a choice names a call that is not dangling, or
    picks an action that call does not offer (the thread changed since the plan was made,
    or the choice is not allowed: only known tools that are not idempotent offer one)."""


class UnreadableThreadError(RunError):
    """Raised when a run is asked of a thread whose stored rows cannot all be decoded: what
    such a row held (a tool result, a reply) is unknown, so nothing can be built on it."""

    @classmethod
    def of(cls, thread_id: str, count: int, first_row_id: object) -> UnreadableThreadError:
        """The error for ``thread_id`` with ``count`` unreadable rows, the first at store row
        ``first_row_id``; its sentence says what to do instead."""
        return cls(
            f"Thread {thread_id!r} has {counted(count, 'unreadable row')} (first: row {first_row_id}); it can be read "
            "but not continued: start a new thread (n in the thread list) to go on."
        )


class FingerprintMismatchError(RunError):
    """Raised by ``prompt()``, ``resume()`` and ``start()`` when the thread was written by
    another definition of the agent (system prompt, tools, model, workflow version); nothing
    ran. ``changes`` lists what differs, one short phrase each ("tool read_file: parameters
    changed", "model: a -> b"). Passing ``accept_changes=True`` goes on and records the
    override in the thread. (Another first input is :class:`FirstInputChangedError`.)"""

    def __init__(self, message: str, *, changes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.changes = changes


class FirstInputChangedError(RunError):
    """Raised by ``start()`` when the thread was started with another first input: a thread
    id names one job, so nothing ran, and ``accept_changes`` does not change that (it goes
    on past a changed definition of the agent only). Start the input as another thread."""


class WaitingForAnswerError(RunError):
    """Raised when a run is asked of a thread waiting for a human answer (cubeloop's
    pending request): running would settle the question's call and lose the answer."""


class WriteFailed(RunError):
    """Raised inside a run when a write it needs failed (or its lease is gone), so the run
    must end failed; its text is the sentence the run ends with (made by
    ``core.recorder.RunRecorder.stopped_by``). Caught by ``core.agent.Agent``: it never
    reaches the agent's callers."""


# --- commands to a run elsewhere --------------------------------------------------------------


class ThreadNotRunningError(RunError):
    """Raised by ``core.commands.send`` when the thread has no live lease (it finished or
    never ran; see :class:`ThreadCrashedError` for a crash); ``view`` is the
    ``core.lease_status.LeaseView`` read."""

    def __init__(self, message: str, *, view: object = None) -> None:
        super().__init__(message)
        self.view = view


class ThreadCrashedError(ThreadNotRunningError):
    """Raised by ``core.commands.send`` when the thread's runner crashed (a stale lease, run not completed)."""


class CommandError(RunError):
    """Raised by ``core.commands.send`` for a command that cannot be sent as given (a steer
    without text), and by ``core.commands.discard`` while a run holds the thread (its
    commands are in flight)."""


class CommandRaced(CommandError):
    """An edit or cancel lost to its runner: the command was delivered (or settled) meanwhile.

    ``command`` is the command as stored; ``text`` the text the user meant to send (the
    edit, or the cancelled text), so the screen can offer it again and nothing is lost."""

    def __init__(self, message: str, *, command: object, text: str) -> None:
        super().__init__(message)
        self.command = command
        self.text = text


# --- the command line -------------------------------------------------------------------------


class BadInput(CubepiError):
    """Raised by ``core.runner`` and ``tui.cli`` when the command line or its inputs cannot
    be used; the message is the one sentence shown, and the process exits with
    ``core.runner.BAD_INPUT``."""


# --- human requests and answers (issue 11; core/hitl.py, HumanAnswers in capabilities.py) --


class HumanAnswerError(CubepiError):
    """Base of the errors about answering a thread's pending human request."""


class NotWaitingError(HumanAnswerError):
    """Raised by :func:`core.answers.answer` when the thread has no pending request (a
    thread missing or another owner's is ``ThreadNotFoundError`` there, one sentence for both)."""

    @classmethod
    def of(cls, thread_id: str) -> NotWaitingError:
        """The error for ``thread_id``."""
        return cls(f"Thread {thread_id!r} is not waiting for an answer.")


class StaleAnswerError(HumanAnswerError):
    """Raised by ``HumanAnswers.answer`` when the thread's pending request is not the
    question answered (answered and settled meanwhile, or another question asked since);
    nothing was written. ``thread_id`` and ``question_id`` name what was answered."""

    def __init__(self, message: str, *, thread_id: str, question_id: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.question_id = question_id

    @classmethod
    def of(cls, thread_id: str, question_id: str) -> StaleAnswerError:
        """The error for ``question_id`` of ``thread_id``."""
        return cls(
            f"Thread {thread_id!r} has no pending question {question_id!r}; it was settled already or "
            "another question is pending now: read the thread again.",
            thread_id=thread_id,
            question_id=question_id,
        )


class AlreadyAnsweredError(HumanAnswerError):
    """Raised by ``HumanAnswers.answer`` when the question already has an answer (only the
    first one counts, whoever sent the second); nothing was written. ``stored`` is the
    answer JSON kept."""

    def __init__(self, message: str, *, thread_id: str, question_id: str, stored: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.question_id = question_id
        self.stored = stored

    @classmethod
    def of(cls, thread_id: str, question_id: str, stored: str) -> AlreadyAnsweredError:
        """The error for ``question_id`` of ``thread_id``, whose kept answer is ``stored``
        (shown cut to 200 characters)."""
        shown = stored if len(stored) <= 200 else stored[:199] + "…"
        return cls(
            f"Question {question_id!r} of thread {thread_id!r} was already answered ({shown}); only the first answer counts.",
            thread_id=thread_id,
            question_id=question_id,
            stored=stored,
        )


class AnswerMismatchError(HumanAnswerError, ValueError):
    """Raised by :mod:`core.hitl` when a reply or an answer JSON does not fit the request
    (text to a yes/no question, an unknown option or question key, a required question
    left out, ...); the sentence says what fits."""


class UnreadableRequestError(HumanAnswerError, ValueError):
    """Raised by :func:`core.hitl.parse_request` when a pending request's text is not JSON
    or not a request of a kind this version knows."""


def error_sentence(exc: BaseException) -> str:
    """One line saying what went wrong: the first line of ``exc``'s text, which for our own
    errors is already the sentence for the user; other exceptions are prefixed with their
    type name (``"OSError: ..."``), and an exception without text gives its type name."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, CubepiError) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
