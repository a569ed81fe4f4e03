"""The real app, and the real headless runner, with a model that streams at a fixed rate.

App: ``python -m bench.paced_app [--rate 5000] [--seconds 30] -- STORE [cubepi-tui options]``
starts :func:`tui.cli.main` exactly as the ``cubepi-tui`` console script does, the only
difference being the provider its runs use (``main``'s ``make_provider`` seam): a
:class:`bench.bench_live.PacedProvider` streaming ``--rate`` tokens (about 4 characters
each) per second for ``--seconds``. The tools and system prompt stay the demo agent's.

Another process: ``python -m tui.cli run --db STORE --thread ID --agent bench.paced_app:paced_agent
"prompt"`` is the real ``cubepi-tui run`` with the same provider (rate and length from
:data:`RATE_ENV` and :data:`SECONDS_ENV`), for the app to follow.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.bench_live import PacedProvider
from core.runner import AgentSpec

RATE_ENV = "CUBEPI_BENCH_RATE"
"""Tokens per second of :func:`paced_agent`'s model (default 5000, the issue's fast stream)."""

SECONDS_ENV = "CUBEPI_BENCH_SECONDS"
"""Seconds one reply of :func:`paced_agent`'s model streams (default 30)."""

STAMP_EVERY = 1_000_000
"""PacedProvider stamps every n-th token with the time; the app benchmark reads no stamps
(only the first token carries one), it times what the terminal shows."""


def paced_provider(rate: float, seconds: float) -> PacedProvider:
    """A model streaming ``rate`` tokens per second for ``seconds`` per reply."""
    return PacedProvider(rate, seconds, STAMP_EVERY)


def paced_agent() -> AgentSpec:
    """``cubepi-tui run --agent bench.paced_app:paced_agent``: the paced model with the demo
    agent's tools and system prompt; rate and length from the environment (see the module
    docstring). Raises ``ValueError`` for a value that is not a number."""
    from core import demo

    rate = float(os.environ.get(RATE_ENV, "5000"))
    seconds = float(os.environ.get(SECONDS_ENV, "30"))
    return AgentSpec(paced_provider(rate, seconds), demo.demo_tools(), demo.SYSTEM_PROMPT)


def main(argv: list[str] | None = None) -> None:
    """Start the app with the paced model (see the module docstring); exits as the app does."""
    arguments = sys.argv[1:] if argv is None else argv
    ours, theirs = _split(list(arguments))
    parser = argparse.ArgumentParser(prog="python -m bench.paced_app", description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="tokens per second (default 5000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds one reply streams (default 30)")
    args = parser.parse_args(ours)
    from tui.cli import main as app_main

    app_main(theirs, make_provider=lambda: paced_provider(args.rate, args.seconds))


def _split(arguments: list[str]) -> tuple[list[str], list[str]]:
    """(this entry's options, the app's arguments), split at the first ``--``."""
    if "--" not in arguments:
        return arguments, []
    cut = arguments.index("--")
    return arguments[:cut], arguments[cut + 1 :]


if __name__ == "__main__":
    main()
