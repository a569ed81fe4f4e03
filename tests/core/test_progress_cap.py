"""Progress text is capped where it is made: a 2 MB report is neither kept, persisted nor followed whole."""

from __future__ import annotations

import asyncio

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.events import ToolExecutionUpdate
from core.follow import ThreadFollower
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.supervisor import Supervisor
from core.tools import PROGRESS_TEXT_LIMIT, ToolContext, cap_progress_text, tool
from tui.tool_output import collapse_frames

WAIT = 10.0  # seconds; reached only by a failing test
BLOB = "".join(chr(ord("a") + i % 26) for i in range(2 * 1024 * 1024))  # 2 MiB, no newline
NOTE_ROOM = 60  # characters of the "… N earlier characters cut … " note


def test_short_text_and_none_pass_unchanged() -> None:
    assert cap_progress_text(None) is None
    assert cap_progress_text("") == ""
    exact = "x" * PROGRESS_TEXT_LIMIT
    assert cap_progress_text(exact) is exact


def test_long_text_keeps_its_end_and_says_how_much_was_cut() -> None:
    capped = cap_progress_text(BLOB)
    assert capped is not None
    assert capped.endswith(BLOB[-PROGRESS_TEXT_LIMIT:])
    assert capped.startswith(f"… {len(BLOB) - PROGRESS_TEXT_LIMIT:,} earlier characters cut …\n")
    assert len(capped) <= PROGRESS_TEXT_LIMIT + NOTE_ROOM


def test_latest_frame_of_a_redrawn_line_survives_the_cap() -> None:
    frames = "".join(f"\rprogress {i:5d}/10000" for i in range(1, 10_001))
    capped = cap_progress_text(frames)
    assert capped is not None and capped.endswith("\rprogress 10000/10000")


def _shown(capped: str) -> list[str]:
    """The lines of ``capped`` as a terminal (and the app) shows them: frames collapsed."""
    return [collapse_frames(line) for line in capped.split("\n")]


def _note(cut: int) -> str:
    return f"… {cut:,} earlier characters cut …"


BAR = "".join(f"\rprogress {i:5d}/10000 [{'#' * (i * 12 // 10_000):<12}]" for i in range(1, 10_001))
"""A progress bar redrawn 10,000 times (the tester's): each frame shorter than the note."""


@pytest.mark.parametrize(
    "cut", [BAR.index(f"progress {i:5d}") + shift for i in range(1000, 10_001, 1000) for shift in (0, 7, 19)]
)
def test_a_capped_bar_shows_its_latest_frame_whole_and_the_note_intact(cut: int) -> None:
    """Wherever the report ends, the cap keeps whole frames only: the line shows exactly
    what the whole report shows (no stray ``]`` of a frame cut in the middle), and the
    note is a line of its own that no frame overwrites."""
    text = BAR[: cut + 40]
    capped = cap_progress_text(text)
    assert capped is not None
    note, line = _shown(capped)
    assert line == collapse_frames(text)
    kept = capped.split("\n", 1)[1]
    assert note == _note(len(text) - len(kept)) and text.endswith(kept)
    assert kept.startswith("progress") and len(kept) <= PROGRESS_TEXT_LIMIT


def test_a_short_latest_frame_after_a_long_one_is_not_overwritten_by_the_note() -> None:
    text = "x" * 5000 + "\rdone"
    assert _shown(cap_progress_text(text) or "") == [_note(5001), "done"]


def test_a_log_is_cut_at_a_line_start() -> None:
    log = "\n".join(f"log line {i}" for i in range(50_000))
    note, first, *rest = _shown(cap_progress_text(log) or "")
    assert first.startswith("log line ") and log.endswith("\n".join([first, *rest]))
    assert rest[-1] == "log line 49999" and note == _note(len(log) - len("\n".join([first, *rest])))


def test_one_frame_longer_than_the_limit_keeps_its_end_below_the_note() -> None:
    text = "old\r" + "y" * (PROGRESS_TEXT_LIMIT + 10) + "\n"  # the only line start is at the very end
    assert _shown(cap_progress_text(text) or "") == [_note(15), "y" * (PROGRESS_TEXT_LIMIT - 1), ""]


async def test_a_tool_reporting_2_mb_is_capped_in_events_state_and_live_events() -> None:
    store = MemoryCheckpointer()
    gate = asyncio.Event()
    seen_in_state: list[int] = []

    @tool
    async def flood(ctx: ToolContext) -> str:
        """Report the whole output so far, then wait for the gate."""
        ctx.report(progress=0.5, text=BLOB)
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return "flooded"

    provider = FauxProvider([faux_reply(faux_tool_call("flood", {}, id="f1")), "done"])
    agent = Agent(provider, store, "t", tools=[flood])
    events: list[ToolExecutionUpdate] = []
    agent.subscribe(lambda e: events.append(e) if isinstance(e, ToolExecutionUpdate) else None)

    def state_text(_: object) -> None:
        running = agent.state.running_tools.get("f1")
        if running is not None and running.text:
            seen_in_state.append(len(running.text))

    agent.subscribe(state_text)
    follower = ThreadFollower(store, "t", poll=0.01)
    await follower.start()
    run = asyncio.create_task(Supervisor(agent).prompt("Flood."))
    async with asyncio.timeout(WAIT):
        while "f1" not in follower.model.running_tools or not follower.model.running_tools["f1"].text:
            await asyncio.sleep(0.01)
    followed = follower.model.running_tools["f1"].text
    gate.set()
    assert await asyncio.wait_for(run, WAIT) == "completed"
    await follower.stop()

    assert [e.text for e in events] == [cap_progress_text(BLOB)]
    assert seen_in_state and max(seen_in_state) <= PROGRESS_TEXT_LIMIT + NOTE_ROOM
    # What another process reads back from the store's live events is the capped text.
    assert followed == cap_progress_text(BLOB)
