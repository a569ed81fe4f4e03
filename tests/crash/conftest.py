"""Crash tests report what they did (kill counts per crash point, seeds) in pytest's summary,
so the numbers show in CI output without ``-s``; and they run on every store backend.

``store_backend`` parametrises a test over ``sqlite``, ``postgres`` and ``redis`` (marked;
see :mod:`tests.helpers.store_backends` for when the server ones skip), and
``make_location`` makes fresh stores of that backend: ``await make_location("agents0")``
gives the location string of a new, empty store (not opened yet), removed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.crash_report import REPORT
from tests.helpers.store_backends import BACKEND_PARAMS, new_location, require_backend


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("crash tests")
        for line in REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(params=BACKEND_PARAMS)
def store_backend(request: pytest.FixtureRequest) -> str:
    """The backend name of this run of the test (skipped when its module is not importable)."""
    require_backend(request.param)
    return request.param


@pytest.fixture
async def make_location(store_backend: str, tmp_path: Path) -> AsyncIterator[Callable[[str], Awaitable[str]]]:
    """A factory of new, empty stores of ``store_backend``: label -> location string."""
    async with AsyncExitStack() as stack:

        async def make(label: str) -> str:
            return await stack.enter_async_context(new_location(store_backend, tmp_path, label))

        yield make
