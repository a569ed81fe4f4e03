"""Crash tests report what they did (kill counts per crash point, seeds) in pytest's summary,
so the numbers show in CI output without ``-s``."""

from __future__ import annotations

from typing import Any

from tests.helpers.crash_report import REPORT


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("crash tests")
        for line in REPORT:
            terminalreporter.write_line(line)
