"""Lines the crash tests report; ``tests/crash/conftest.py`` prints them at the end of the run."""

from __future__ import annotations

REPORT: list[str] = []
"""Lines the crash tests add; printed under "crash tests" at the end of the run."""
