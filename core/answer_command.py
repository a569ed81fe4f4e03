"""``cubepi-tui answer``: answer a thread's pending human request from a shell.

    cubepi-tui answer --db threads.sqlite --thread t1 --approve
    cubepi-tui answer --db threads.sqlite --thread t1 --deny "not on prod"
    cubepi-tui answer --db postgresql://me@host/agents --thread t1 --choice prod
    cubepi-tui answer --db threads.sqlite --unowned --upgrade --thread t1 --answer target=src/cli.py --answer env=prod

The store and its owner are chosen as for ``run`` (:mod:`core.runner`: ``--db``, else
``$CUBEPI_DB``, else the default file; ``--owner``, ``--unowned``). The answer is recorded
once (:func:`core.answers.answer`); the run that asked goes on with it, wherever it runs.
Exit status: 0 answered (one line on stdout), 2 bad input (one sentence on stderr: bad
arguments, a thread not waiting or unavailable, a reply that does not fit the request,
an answer already given, a store that cannot be opened or is browse-only without
``--upgrade``), 1 when the store failed meanwhile. Never imports the app (``tui``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from core.answers import answer
from core.checkpoint.locations import ENV_VAR, chosen_location, describe_location, open_store
from core.hitl_replies import ApproveReply, ChoiceReply, DenyReply, EditReply, KeyedReply, Reply, TextReply, YesNoReply
from core.runner import (
    BAD_INPUT,
    BadInput,
    SentenceParser,
    add_owner_options,
    chosen_owner,
    ended_by,
    say,
    upgrade_if_asked,
)


def answer_parser() -> argparse.ArgumentParser:
    """The ``answer`` command's argument parser (``--help`` explains every option)."""
    p = SentenceParser(
        prog="cubepi-tui answer",
        description="Answer the question a thread is waiting on (an approval, a yes/no question, "
        "or questions to answer by text or choice); the run that asked goes on with the answer.",
    )
    p.add_argument("--thread", metavar="ID", required=True, help="the waiting thread")
    p.add_argument(
        "--db",
        metavar="URL|PATH",
        help=f"the store of threads, as for run (default ${ENV_VAR}, else the app's default SQLite file)",
    )
    add_owner_options(p)
    p.add_argument("--question", metavar="QID", help="answer only if this is the pending question's id")
    reply = p.add_mutually_exclusive_group(required=True)
    reply.add_argument("--approve", action="store_true", help="approve the tool call")
    reply.add_argument("--deny", metavar="REASON", help="deny the tool call; REASON becomes its result")
    reply.add_argument("--edit", metavar="JSON", help="run the tool call with these arguments (a JSON object)")
    reply.add_argument("--yes", action="store_true", help="answer a yes/no question yes")
    reply.add_argument("--no", action="store_true", help="answer a yes/no question no")
    reply.add_argument("--text", metavar="T", help="answer the one question with text")
    reply.add_argument(
        "--choice", metavar="V", action="append", help="pick an option by value or label (again for several)"
    )
    reply.add_argument(
        "--answer",
        metavar="KEY=VALUE",
        action="append",
        help="answer the question KEY (repeat for each question; a key twice gives a multi-select several)",
    )
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="add cubepi-tui's tables (or keys) to a cubeloop (or older) store before answering",
    )
    return p


def reply_of(args: argparse.Namespace) -> Reply:
    """The reply the parsed options give. Raises ``BadInput`` for ``--edit`` that is not a
    JSON object and ``--answer`` without ``=`` or with an empty key."""
    if args.approve:
        return ApproveReply()
    if args.deny is not None:
        return DenyReply(args.deny or None)
    if args.edit is not None:
        try:
            edited = json.loads(args.edit)
        except ValueError:
            edited = None
        if not isinstance(edited, dict):
            raise BadInput('--edit takes the tool\'s arguments as a JSON object, such as \'{"path": "/tmp/x"}\'.')
        return EditReply(edited)
    if args.yes or args.no:
        return YesNoReply(bool(args.yes))
    if args.text is not None:
        return TextReply(args.text)
    if args.choice:
        return ChoiceReply(tuple(args.choice))
    values: dict[str, list[str]] = {}
    for pair in args.answer:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"--answer takes KEY=VALUE, not {pair!r}.")
        values.setdefault(key, []).append(value)
    return KeyedReply({k: v[0] if len(v) == 1 else v for k, v in values.items()})


async def answer_headless(
    db: str | os.PathLike[str] | None,
    thread_id: str,
    reply: Reply,
    *,
    owner: str | None = None,
    question_id: str | None = None,
    upgrade: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Answer ``thread_id``'s pending request in the store at ``db`` (never created here)
    for ``owner`` and return the exit status (see the module docstring). Never raises; the
    one line goes to ``out`` or ``err``, escaped (:func:`core.runner.plain`): the request
    and the answer may hold tool or model text."""
    out = out or sys.stdout
    err = err or sys.stderr
    chosen = chosen_location(db)
    where = describe_location(chosen.location)
    store: Any = None
    try:
        if not thread_id.strip():
            raise BadInput("The thread id is empty.")
        store = await open_store(chosen.location, create=False, owner=owner)
        await upgrade_if_asked(store, where, upgrade, "answering")
        answered = await answer(store, thread_id, reply, question_id=question_id)
        say(out, answered.sentence)
        return 0
    except Exception as exc:
        return ended_by(exc, err)
    finally:
        if store is not None:
            await store.close()


def main(argv: Sequence[str]) -> int:
    """``cubepi-tui answer ARGS`` (``argv`` without the word ``answer``): parse, answer,
    return the exit status (2 for bad arguments, with one sentence on stderr)."""
    try:
        args = answer_parser().parse_args(list(argv))
        owner = chosen_owner(args.owner, args.unowned)
        reply = reply_of(args)
    except BadInput as exc:
        say(sys.stderr, f"cubepi-tui answer: {exc}")
        return BAD_INPUT
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    return asyncio.run(
        answer_headless(args.db, args.thread, reply, owner=owner, question_id=args.question, upgrade=args.upgrade)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
