"""Appearance, compared with accepted SVG snapshots (``pytest --snapshot-update`` after looking).

One test per README screenshot: each plays the scene ``python -m tests.screenshots`` saves
(``tests/helpers/scenes.py``, one place per scene), held still the same way (frozen clock,
fixed hosts and ids, tools paused at a known step), so the picture and its test agree.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.helpers.scenes import SCENES, Stage, staged


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Messages show local clock times; pin the zone so the snapshot is the same everywhere."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def stage(tmp_path: Path, cubeloop_crashpoints: tuple[Path, dict[str, object]], utc: None) -> Iterator[Stage]:
    """A scene's stage in this test's directory: frozen clock, fixed hosts and ids, children
    killed at the end."""
    with staged(tmp_path / "scene", cubeloop_crashpoints[0]) as played:
        yield played


def _compare(snap_compare: Any, stage: Stage, name: str) -> bool:
    scene = SCENES[name]
    # prepare runs the real cubeloop and our agent; the app runs in snap_compare's own loop.
    app = asyncio.run(scene.app(stage))

    async def drive(pilot: Pilot[Any]) -> None:
        await scene.drive(pilot, stage)

    return bool(snap_compare(app, terminal_size=scene.size, run_before=drive))


def test_crash_banner_of_a_cubeloop_thread(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "crash")


def test_a_cubeloop_thread_waiting_for_an_answer(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "waiting")


def test_the_answer_dialog_of_a_cubeloop_approval(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "answer")


def test_a_new_thread_running_its_tools(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "thread")


def test_the_picker_with_runs_here_and_elsewhere(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "picker")


def test_a_thread_another_process_runs_with_a_steer_queued(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "elsewhere")


def test_the_resume_confirmation(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "resume")


def test_the_thread_list_of_one_owner(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "owners")


def test_what_changed_before_a_new_prompt(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "changes")


def test_the_owner_line_with_an_accepted_override(snap_compare: Any, stage: Stage) -> None:
    assert _compare(snap_compare, stage, "owner-line")


def test_every_readme_screenshot_is_a_scene() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    shown = set(re.findall(r"\(screenshots/([\w-]+)\.svg\)", readme))
    assert shown, "the README shows no screenshot"
    assert shown <= set(SCENES), f"README screenshots without a scene (and a snapshot test): {shown - set(SCENES)}"
