"""Tools' child processes end with the run's abort: the whole process group, SIGTERM then SIGKILL.

Every test runs real processes: a child (a Python script) that starts a grandchild which
would write a file a little later. Before :mod:`core.processes`, a tool written the obvious
way (``create_subprocess_exec`` and ``await proc.wait()``) left both running after the abort,
and the file appeared after the run said "aborted".
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from core.agent import Agent
from core.checkpoint.memory import MemoryCheckpointer
from core.demo import demo_tools
from core.events import ToolExecutionUpdate
from core.messages import ToolResultMessage
from core.processes import ABORTED, run_process
from core.providers.faux import FauxProvider, faux_reply, faux_tool_call
from core.tools import ToolContext, tool

LIVENESS = 30.0  # seconds; reached only by a failing test
LATE = 1.0  # seconds after its start at which the grandchild would write its file

# The child: starts the grandchild (same process group), prints both pids, then waits.
# The grandchild: sleeps LATE seconds, then writes the file named by argv[1].
GRANDCHILD = "import sys, time\ntime.sleep({late})\nopen(sys.argv[1], 'w').write('too late')\n"
CHILD = (
    "import signal, subprocess, sys, time\n"
    "if sys.argv[2] == 'stubborn':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "g = subprocess.Popen([sys.executable, '-c', {grandchild!r}, sys.argv[1]])\n"
    "print('pids', {pid}, g.pid, flush=True)\n"
    "if sys.argv[3] == 'wait':\n"
    "    time.sleep(60)\n"
)


def _child(marker: Path, mode: str = "polite", then: str = "wait") -> list[str]:
    script = CHILD.format(grandchild=GRANDCHILD.format(late=LATE), pid="__import__('os').getpid()")
    return [sys.executable, "-c", script, str(marker), mode, then]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie nobody reaped counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _context(signal: asyncio.Event, grace: float = 5.0) -> ToolContext:
    return ToolContext("call-1", signal, lambda progress, text: None, None, grace)


async def _never_written(marker: Path) -> None:
    # The grandchild would have written it LATE s after its start: wait past that, and more.
    await asyncio.sleep(LATE * 2.5)
    assert not marker.exists(), "a process of the aborted call wrote its file after the abort"


async def test_abort_ends_the_child_and_its_grandchild(tmp_path: Path) -> None:
    marker = tmp_path / "late.txt"
    signal = asyncio.Event()
    pids: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("pids "):
            pids.extend(int(p) for p in line.split()[1:])
            signal.set()  # the run is aborted once both processes run

    outcome = await asyncio.wait_for(run_process(_context(signal), _child(marker), on_line=on_line), LIVENESS)
    assert len(pids) == 2
    assert outcome.aborted and not outcome.killed
    result = outcome.tool_result()
    assert result.is_error and str(result.content).startswith(ABORTED + ": ")
    assert ABORTED == "aborted after start; partial effects possible"
    assert not any(alive(pid) for pid in pids)
    await _never_written(marker)


async def test_a_child_ignoring_sigterm_gets_sigkill_after_the_grace(tmp_path: Path) -> None:
    marker = tmp_path / "late.txt"
    signal = asyncio.Event()
    pids: list[int] = []
    aborted_at = 0.0

    def on_line(line: str) -> None:
        nonlocal aborted_at
        if line.startswith("pids "):
            pids.extend(int(p) for p in line.split()[1:])
            aborted_at = time.monotonic()
            signal.set()

    grace = 0.6
    run = run_process(_context(signal), _child(marker, "stubborn"), on_line=on_line, term_grace=grace)
    outcome = await asyncio.wait_for(run, LIVENESS)
    assert time.monotonic() - aborted_at >= grace  # it was given the grace before SIGKILL
    assert outcome.aborted and outcome.killed
    assert f"SIGTERM, then SIGKILL after {grace:g} s" in str(outcome.tool_result().content)
    assert not any(alive(pid) for pid in pids)
    await _never_written(marker)


async def test_processes_a_finished_child_left_behind_end_with_the_call(tmp_path: Path) -> None:
    marker = tmp_path / "late.txt"
    pids: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("pids "):
            pids.extend(int(p) for p in line.split()[1:])

    run = run_process(_context(asyncio.Event()), _child(marker, then="exit"), on_line=on_line)
    outcome = await asyncio.wait_for(run, LIVENESS)
    assert outcome.returncode == 0 and not outcome.aborted
    assert not outcome.tool_result().is_error
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)
    await _never_written(marker)


async def test_output_is_kept_exactly_and_failures_say_their_status(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.buffer.write(b'caf\\xe9\\n'); sys.stderr.write('oops\\n'); sys.exit(3)"
    outcome = await asyncio.wait_for(run_process(_context(asyncio.Event()), [sys.executable, "-c", code]), LIVENESS)
    assert outcome.returncode == 3
    assert "caf\udce9" in outcome.output and "oops" in outcome.output  # stdout and stderr, bytes kept
    result = outcome.tool_result()
    assert result.is_error and "exited with status 3" in str(result.content)
    with pytest.raises(OSError):
        await run_process(_context(asyncio.Event()), [str(tmp_path / "no-such-program")])


async def test_the_agents_abort_reaches_the_process_group_through_the_tool(tmp_path: Path) -> None:
    marker = tmp_path / "late.txt"
    pids: list[int] = []
    started = asyncio.Event()

    @tool
    async def build(ctx: ToolContext) -> object:
        """Build something in a child process."""

        def on_line(line: str) -> None:
            if line.startswith("pids "):
                pids.extend(int(p) for p in line.split()[1:])
                started.set()

        return (await run_process(ctx, _child(marker), on_line=on_line)).tool_result()

    store = MemoryCheckpointer()
    provider = FauxProvider([faux_reply("Building.", faux_tool_call("build", {})), faux_reply("Done.")])
    agent = Agent(provider, store, "t1", tools=[build], abort_grace=4.0)
    run = asyncio.create_task(agent.prompt("build it"))
    await asyncio.wait_for(started.wait(), LIVENESS)
    agent.abort()
    assert await asyncio.wait_for(run, LIVENESS) == "aborted"
    data = await store.load("t1")
    assert data is not None
    results = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert len(results) == 1 and results[0].is_error
    assert results[0].text.startswith(ABORTED + ": ")
    assert not any(alive(pid) for pid in pids)
    await _never_written(marker)


async def test_the_demos_trainer_runs_in_a_child_and_says_so_when_aborted() -> None:
    store = MemoryCheckpointer()
    tools = [t for t in demo_tools(speed=1.0) if t.name == "train_model"]
    provider = FauxProvider(
        [faux_reply("Training.", faux_tool_call("train_model", {"model": "m", "epochs": 2})), faux_reply("Stopped.")]
    )
    agent = Agent(provider, store, "t1", tools=tools)
    before = set(_children(os.getpid()))  # this process's other children (of earlier tests)
    progressed = asyncio.Event()
    agent.subscribe(lambda e: progressed.set() if isinstance(e, ToolExecutionUpdate) and e.text else None)
    run = asyncio.create_task(agent.prompt("train"))
    await asyncio.wait_for(progressed.wait(), LIVENESS)  # the child printed its first step
    children = [pid for pid in _children(os.getpid()) if pid not in before]
    assert children and all(os.getpgid(pid) == pid for pid in children)  # each leads its own group
    agent.abort()
    assert await asyncio.wait_for(run, LIVENESS) == "aborted"
    data = await store.load("t1")
    assert data is not None
    (result,) = [m for m in data.messages if isinstance(m, ToolResultMessage)]
    assert result.is_error
    assert result.text == f"{ABORTED}: the process group of the trainer process was ended (SIGTERM)."
    assert not any(alive(pid) for pid in children)


def _children(parent: int) -> list[int]:
    """Pids of the running direct children of ``parent`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if int(fields[1]) == parent and fields[0] not in (b"Z", b"X"):
                found.append(int(entry))
    return found
