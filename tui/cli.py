"""The composition root: command-line arguments, the store location, the provider.

This is the only module of the app that chooses concrete parts (the store, through
:mod:`core.checkpoint.locations`; the Anthropic provider; the demo agent); everything else
works with what it is given.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from core.checkpoint import locations
from core.checkpoint.base import Checkpointer
from core.checkpoint.reconnect import OnStatus
from core.errors import BadInput, DatabaseOpenError
from core.fingerprints import check_workflow
from core.owners import OWNER_ENV, resolve_owner
from core.runner import BAD_INPUT, COMMANDS, SentenceParser, add_owner_options, chosen_owner, positive_number
from tui.attention import Alerts
from tui.session import Session
from tui.session_config import INPUT_QUIET, ProviderFactory, SessionConfig

DEFAULT_MODEL = "claude-sonnet-4-5"
"""The Anthropic model used when ``ANTHROPIC_API_KEY`` is set and ``--model`` is not given."""

DESCRIPTION = """\
Watch, abort, steer and resume long-running LLM agents whose threads are stored in a
SQLite file, a PostgreSQL database or Redis (cubepi-tui's own, or one written by cubeloop).

STORE is a SQLite file path or a server URL:
  cubepi-tui threads.sqlite
  cubepi-tui postgresql://user:password@host:5432/dbname   (or postgres://)
  cubepi-tui redis://:password@host:6379/0                 (or rediss://, unix:///path.sock)
With no STORE, the {env} environment variable names it; without that, the default
database is used and created if missing:
  {default}
A STORE given is created if it does not exist (a file: if its directory is writable;
pass --no-create to refuse). A store written by cubeloop or an older cubepi-tui opens
browse-only; the first run on it asks before adding cubepi-tui's tables. Passwords are
never shown: the screen names a server without one.

Owners: the store is opened for one owner, and the thread list shows only that owner's
threads ("threads of alice · 12"); another owner's thread reads as missing. The owner
is --owner NAME, else the {owner_env} environment variable, else your user name. Threads
that record no owner (written by cubeloop or an older cubepi-tui) open with --unowned.

Model: with ANTHROPIC_API_KEY set, new turns use Anthropic ({model} unless --model says
otherwise); without it, or with --demo, the built-in demo agent answers (no key needed):
it streams text and runs slow tools with progress, so every key can be tried.

Headless runs (no terminal UI; the app, in any process, watches and commands them):
  cubepi-tui run --db URL|PATH --thread ID "prompt"     start a run on a new or old thread
  cubepi-tui run --db URL|PATH --thread ID --resume     resume a crashed thread
  cubepi-tui run --db URL|PATH --thread ID --demo "..." with the demo agent
  cubepi-tui delete --db URL|PATH ID                    delete one thread of this owner
  cubepi-tui answer --db URL|PATH --thread ID --approve answer the question a thread waits on
                    (or --deny REASON, --edit JSON, --yes, --no, --text T, --choice V,
                     --answer KEY=VALUE ...)
--db defaults to {env}, then the default database, as for the app.
See `cubepi-tui run --help`, `cubepi-tui delete --help` and `cubepi-tui answer --help` for their options.
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (``--help`` explains every option). Raises ``BadInput`` with
    one sentence for arguments it cannot use."""
    parser = SentenceParser(
        prog="cubepi-tui",
        description=DESCRIPTION.format(
            default=locations.default_sqlite_path(), model=DEFAULT_MODEL, env=locations.ENV_VAR, owner_env=OWNER_ENV
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "database",
        nargs="?",
        metavar="STORE",
        help=f"SQLite file or postgresql:// / redis:// URL of the threads (default: ${locations.ENV_VAR}, see above)",
    )
    parser.add_argument("--thread", metavar="ID", help="open this thread directly instead of the thread list")
    add_owner_options(parser)
    parser.add_argument(
        "--workflow",
        metavar="V",
        help="the version of the agent's workflow runs started here record (as `cubepi-tui run --workflow`)",
    )
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="Anthropic model for new turns; needs ANTHROPIC_API_KEY (without the key the app browses only)",
    )
    parser.add_argument("--demo", action="store_true", help="use the built-in demo agent even if an API key is set")
    parser.add_argument(
        "--demo-speed",
        type=positive_number,
        default=1.0,
        metavar="X",
        help="demo pace multiplier: 2 runs the demo twice as fast (default 1)",
    )
    parser.add_argument(
        "--no-bell",
        dest="bell",
        action="store_false",
        help="do not ring the bell when a thread waits for you or crashes",
    )
    parser.add_argument(
        "--no-notices",
        dest="notices",
        action="store_false",
        help="do not show a notice when a thread waits for you or crashes",
    )
    parser.add_argument(
        "--keymap",
        metavar="PATH",
        help="the keymap file (TOML, a [keys] table of action id = keys; "
        "default: $CUBEPI_KEYMAP, else $XDG_CONFIG_HOME/cubepi-tui/keymap.toml)",
    )
    parser.add_argument(
        "--no-create",
        dest="create",
        action="store_false",
        help="fail instead of creating STORE when it does not exist",
    )
    args = parser.parse_args(argv)
    args.owner = chosen_owner(args.owner, args.unowned)
    if args.workflow is not None:
        try:
            check_workflow(args.workflow)
        except ValueError as error:
            raise BadInput(str(error)) from None
    return args


ANSWER_COMMAND = "answer"
"""The first argument that makes the command line ``cubepi-tui answer`` (:mod:`core.answer_command`)."""

NO_TERMINAL = 1
"""Exit status when the app has no terminal: an error that kept it from starting (as for a
database it cannot open), not bad arguments (2): the same command works in a terminal."""


def terminal_problem(stdin: Any = None, screen: Any = None) -> str | None:
    """One sentence when the app cannot run here, else ``None``.

    The app reads keys from ``stdin`` and draws on ``screen`` (``sys.__stderr__``: Textual's
    Linux driver writes there, so a piped stdout is fine); both must be terminals. Without
    one Textual's input thread reads end-of-file again and again and the app spins at 100 %
    CPU with nobody to see it. Never raises.
    """
    stdin = sys.__stdin__ if stdin is None else stdin
    screen = sys.__stderr__ if screen is None else screen
    missing = [name for name, stream in (("standard input", stdin), ("standard error", screen)) if not _is_tty(stream)]
    if not missing:
        return None
    return (
        f"The app needs a terminal, and its {' and '.join(missing)}"
        f" {'is not one' if len(missing) == 1 else 'are not terminals'};"
        ' to run a thread without a terminal use `cubepi-tui run --db PATH --thread ID "prompt"`.'
    )


def _is_tty(stream: Any) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, OSError, ValueError):  # closed, or not a real stream
        return False


def store_opener(
    location: str | os.PathLike[str],
    *,
    create: bool,
    make_parent: bool = False,
    on_busy: Callable[[int], None] | None = None,
    on_status: OnStatus | None = None,
    owner: str | None = None,
) -> Any:
    """An async callable that opens the store at ``location`` (a SQLite path or a server
    URL: :func:`core.checkpoint.locations.open_store`; see ``Session.open_store``) for
    ``owner`` (``None``: the default owner; :data:`core.owners.UNOWNED`: unowned threads).

    ``on_busy(attempt)`` is called each time a locked SQLite file makes a call wait and
    retry, ``on_status(status)`` each time a server store reconnects or is back.
    """

    async def open_store() -> Checkpointer:
        return await locations.open_store(
            location, create=create, make_parent=make_parent, on_busy=on_busy, on_status=on_status, owner=owner
        )

    return open_store


def build_session(
    location: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
    demo: bool = False,
    model: str | None = None,
    demo_speed: float = 1.0,
    store: Checkpointer | None = None,
    owner: str | None = None,
    workflow: str | None = None,
    make_provider: ProviderFactory | None = None,
    alerts: Alerts | None = None,
    tools: Sequence[Any] | None = None,
    system_prompt: str | None = None,
    agent_options: Mapping[str, Any] = MappingProxyType({}),
    input_quiet: float = INPUT_QUIET,
) -> Session:
    """The session the app drives: which store, which provider, which tools.

    ``location`` is a SQLite path or a server URL; ``None`` means ``CUBEPI_DB``, else the
    default file (created with its directory), as :func:`core.checkpoint.locations.chosen_location`
    says. ``store`` replaces it (tests pass a ready store, opened for its own owner). The
    store is opened for ``owner`` (``None``: the default owner, see :mod:`core.owners`;
    ``ValueError``, one sentence, for a name that cannot be an owner). Runs started here
    record ``workflow`` as the agent's workflow version (``None``: none). With ``demo`` or without ``ANTHROPIC_API_KEY`` (and no ``model``) the demo agent is used.
    ``make_provider`` replaces that choice of provider (benchmarks pass a paced one); the
    session's tools and system prompt stay the demo agent's unless ``tools`` or
    ``system_prompt`` replace them (``None``: the demo agent's). ``agent_options`` are more
    keywords for every ``Agent`` (e.g. ``approvals``). ``alerts`` says whether the bell rings
    and a notice shows when a thread waits for an answer or crashes (default: both);
    ``input_quiet`` is :attr:`tui.session_config.SessionConfig.input_quiet` (seconds). The
    session's configuration is built here once and never changes.
    """
    from core import demo as demo_agent

    use_demo = demo or (model is None and not os.environ.get("ANTHROPIC_API_KEY"))
    name = "demo" if use_demo else (model or DEFAULT_MODEL)

    def chosen_provider() -> Any:
        if use_demo:
            return demo_agent.demo_provider(speed=demo_speed)
        from core.providers.anthropic import AnthropicProvider

        return AnthropicProvider(model=name)

    if make_provider is not None:
        name = "custom"
    opens_for: str | None = None
    if store is not None:
        ready = store

        async def open_ready() -> Checkpointer:
            return ready

        open_store, described = open_ready, "memory"
    else:
        chosen = locations.chosen_location(location)
        opens_for = resolve_owner(owner)
        # The store reports to the session, which does not exist yet: late-bound through it.
        open_store = store_opener(
            chosen.location,
            create=create or chosen.default,
            make_parent=chosen.default,
            on_busy=lambda attempt: session.report_busy(attempt),
            on_status=lambda status: session.report_status(status),
            owner=opens_for,
        )
        described = locations.describe_location(chosen.location)
    session = Session(
        SessionConfig(
            open_store,
            make_provider or chosen_provider,
            location=described,
            model=name,
            tools=demo_agent.demo_tools(speed=demo_speed) if tools is None else tools,
            system_prompt=demo_agent.SYSTEM_PROMPT if system_prompt is None else system_prompt,
            agent_options={**agent_options, "workflow": workflow},
            alerts=alerts or Alerts(),
            opens_for=opens_for,
            input_quiet=input_quiet,
        )
    )
    return session


def main(argv: Sequence[str] | None = None, *, make_provider: ProviderFactory | None = None) -> None:
    """Entry point of the ``cubepi-tui`` console script.

    ``make_provider`` replaces the provider the arguments choose for the app's runs (see
    :func:`build_session`; ``bench.paced_app`` passes one that streams at a fixed rate);
    the headless ``run`` and ``delete`` commands ignore it.

    ``cubepi-tui run ...`` is the headless runner and ``cubepi-tui delete ...`` deletes a
    thread (:func:`core.runner.main`, both); ``cubepi-tui answer ...`` answers a waiting
    thread (:func:`core.answer_command.main`). They never import Textual, so they start
    fast and run where no terminal UI could.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == [ANSWER_COMMAND]:
        from core.answer_command import main as answer_main

        sys.exit(answer_main(arguments[1:]))
    if arguments[:1] and arguments[0] in COMMANDS:
        from core.runner import main as run_main

        sys.exit(run_main(arguments))

    try:
        args = parse_args(arguments)
        # A mistyped scheme is bad input, said before any screen is drawn.
        locations.backend_of(locations.chosen_location(args.database).location)
    except (BadInput, DatabaseOpenError) as error:
        print(f"cubepi-tui: {error}", file=sys.stderr)
        sys.exit(BAD_INPUT)
    problem = terminal_problem()
    if problem is not None:
        print(f"cubepi-tui: {problem}", file=sys.stderr)
        sys.exit(NO_TERMINAL)
    # While text streams, Textual allocates many short-lived objects; with the default
    # thresholds a full (generation 2) collection ran about every 0.5 s and stalled the
    # event loop 110-145 ms each time (measured with 60 messages on screen). Collecting
    # the young generations less often keeps the worst stall near 40 ms. Set before
    # Textual is imported: that import spent 32-36 ms of CPU in collections with the
    # default thresholds, 7 ms with these (gc.callbacks, issue 10).
    gc.set_threshold(10_000, 50, 100)
    from tui.app import make_app
    from tui.keymap import load_keymap

    session = build_session(
        args.database,
        create=args.create,
        demo=args.demo,
        model=args.model,
        demo_speed=args.demo_speed,
        owner=args.owner,
        workflow=args.workflow,
        make_provider=make_provider,
        alerts=Alerts(bell=args.bell, notices=args.notices),
    )
    app = make_app(session, thread_id=args.thread, keymap=load_keymap(args.keymap))
    app.run()
    # A Textual app that crashed still returns normally from run(); its code says so.
    sys.exit(app.return_code or 0)


if __name__ == "__main__":
    main()
