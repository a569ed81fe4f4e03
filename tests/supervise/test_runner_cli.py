"""``python -m core.runner``: the demo agent, followed live; bad input in one sentence."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.events import RetryWait
from core.follow import ThreadChange, ThreadFollower
from core.lease_status import LeaseState
from core.messages import AssistantMessage, TextContent, ToolCall, ToolResultMessage, user_text
from core.owners import UNOWNED, default_owner
from core.runner import answer_hint, describe, describe_wait, main, plain
from tests.helpers import retrying_agent
from tests.helpers.supervise import ROOT, runner_argv, until


async def test_demo_runner_is_followed_live(db: Path, store, spawn) -> None:
    # The demo cannot be paused, and what the test looks for is fleeting: its first reply
    # streams for about a second, its two first tools overlap for about two. So every change
    # the follower published is looked at (not just the model whenever the test looks),
    # and what each showed is kept with the lease state of that moment.
    argv = runner_argv(db, "t-demo", "--demo", "--speed", "2", "Analyse the sales figures")
    runner = spawn(db, "t-demo", argv=argv)
    streaming: list[LeaseState] = []  # a change that showed the first reply's text streaming
    both: list[LeaseState] = []  # a change that showed both first tools running with progress

    def record(change: ThreadChange) -> None:
        m = change.model
        if m.partial is not None and m.partial.text and len(m.messages) == 1:
            streaming.append(m.lease_view.state)
        if {t.name for t in m.running_tools.values() if t.progress} >= {"fetch_dataset", "train_model"}:
            both.append(m.lease_view.state)

    follower = ThreadFollower(store, "t-demo")
    follower.subscribe(record)  # start() publishes its first change too
    async with follower:
        await until(follower, lambda m: streaming, "demo text streaming", runner=runner)
        await until(follower, lambda m: both, "both demo tools reporting progress", runner=runner)
        assert set(streaming) == set(both) == {LeaseState.RUNNING_ELSEWHERE}  # all while it ran there
        assert await runner.wait() == 0
        await until(follower, lambda m: not m.lease_view.live and len(m.messages) == 7, "the whole demo run")
    out, err = runner.output()
    lines = out.splitlines()
    assert lines[0] == "user: Analyse the sales figures"
    assert lines[-1] == "run completed" and err == ""
    assert sum(line.startswith("tool ") for line in lines) == 3 and len(lines) == 8


async def test_a_retry_wait_is_printed_and_followed_from_another_process(db: Path, store, spawn) -> None:
    argv = runner_argv(db, "t-wait", "--agent", "tests.helpers.retrying_agent:make_agent", "Summarise the sales")
    runner = spawn(db, "t-wait", argv=argv)
    async with ThreadFollower(store, "t-wait") as follower:
        await until(follower, lambda m: m.lease_view.live and m.partial is not None, "the model call", runner=runner)
        assert follower.model.retry is None  # nothing failed yet
        runner.gate(retrying_agent.FAILED)
        retry = await until(follower, lambda m: m.retry, "the retry wait", runner=runner)
        assert retry.wait == RetryWait(retrying_agent.WAIT_SECONDS, "rate limited", 1, 5)
        # Its end is wall-clock time, so a follower that read it late still counts down right.
        left = retry.until - time.time()
        assert 0 < left <= retrying_agent.WAIT_SECONDS
        runner.gate(retrying_agent.DONE)
        assert await runner.wait() == 0
        await until(follower, lambda m: not m.lease_view.live and len(m.messages) == 2, "the whole run")
        assert follower.model.retry is None and follower.model.messages[-1].text == retrying_agent.REPLY
    out, err = runner.output()
    assert out.splitlines() == [
        "user: Summarise the sales",
        "model call: rate limited, retrying in 60 s (attempt 2 of 5)",
        f"assistant: {retrying_agent.REPLY}",
        "run completed",
    ]
    assert err == ""


async def test_a_run_whose_approval_times_out_exits_waiting_and_says_how_to_go_on(db: Path, store, spawn) -> None:
    argv = runner_argv(db, "t-ask", "--agent", "tests.helpers.asking_agent:make_agent", "Tidy /etc")
    runner = spawn(db, "t-ask", argv=argv)
    assert await runner.wait() == 3  # core.runner.EXIT_CODES["waiting"]
    out, err = runner.output()
    assert out.splitlines()[-1] == "run waiting: No answer in 1 s and no default: the run ends waiting for one."
    owner = shlex.quote(default_owner())
    command = f"cubepi-tui answer --db {shlex.quote(str(db))} --owner {owner} --thread t-ask --approve"
    assert err.splitlines() == [
        "Thread 't-ask' waits for an answer (approve delete_file (call_del_1)?); answer it, then run it again "
        f"with --resume: {command} (or --deny REASON, --edit JSON)"
    ]
    data = await store.load("t-ask")
    assert data is not None and data.pending_request is not None  # kept for the answer
    # The command as hinted answers it in the same store, from another directory and a shell
    # without this one's owner variable.
    argv = [str(Path(sys.executable).parent / "cubepi-tui"), *shlex.split(command)[1:]]
    env = {k: v for k, v in os.environ.items() if k not in ("CUBEPI_OWNER", "CUBEPI_DB")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=db.parent, env=env)
    assert done.returncode == 0, done.stderr
    data = await store.load("t-ask")
    assert data is not None and data.pending_request is not None and data.pending_request.answered


def test_the_answer_hint_names_the_store_the_owner_and_the_replies_that_fit() -> None:
    from core.hitl import ApproveRequest, AskRequest, ConfirmRequest, Option, Question

    approval = ApproveRequest(tool_name="rm", tool_call_id="c1", args={})
    assert answer_hint(None, "t 1", "alice", approval) == (
        "cubepi-tui answer --owner alice --thread 't 1' --approve (or --deny REASON, --edit JSON)"
    )
    assert answer_hint("/tmp/a b.sqlite", "t", UNOWNED, ConfirmRequest(prompt="Ship?")) == (
        "cubepi-tui answer --db '/tmp/a b.sqlite' --unowned --thread t --yes (or --no)"
    )
    one = AskRequest(questions=[Question(key="env", prompt="Where?", options=[Option(label="prod", value="prod")])])
    assert answer_hint("postgresql://me:secret@db/agents", "t", "it's", one) == (
        "cubepi-tui answer --db postgresql://me@db/agents --owner 'it'\"'\"'s' --thread t --text TEXT (or --choice VALUE)"
    )
    two = AskRequest(questions=[Question(key="a", prompt="A?"), Question(key="b c", prompt="B?")])
    assert answer_hint(None, "t", "alice", two).endswith("--thread t --answer a=VALUE --answer 'b c'=VALUE")
    assert answer_hint(None, "t", "alice", None).endswith("--thread t REPLY (or see cubepi-tui answer --help)")


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--thread", "t"], "Give either a prompt or --resume"),
        (["--thread", "t", "--resume", "hello"], "Give either a prompt or --resume"),
        (["hello"], "The following arguments are required: --thread"),
        (
            ["--thread", "t", "--demo", "--lease-ttl", "1", "--heartbeat", "2", "hi"],
            "must be positive and shorter than --lease-ttl",
        ),
        (["--thread", "t", "--demo", "--resume"], "Thread 't' is unavailable: owner "),
        (["--thread", "t", "--agent", "no_such_module:make", "hi"], "Cannot import 'no_such_module'"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(tmp_path: Path, args: list[str], sentence: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "core.runner", "run", "--db", str(tmp_path / "x.sqlite"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert sentence in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_database_that_cannot_be_opened_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["run", "--db", str(tmp_path / "missing" / "x.sqlite"), "--thread", "t", "--demo", "--no-create", "hi"])
        == 2
    )
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_lines_escape_control_characters() -> None:
    assert plain("a\nb\x1b[31mred\x07") == "a\\nb\\x1b[31mred\\x07"
    reply = AssistantMessage(
        content=[TextContent(text="Done\n\x1b]0;title\x07"), ToolCall(id="c1", name="ls", arguments={"p": "/"})]
    )
    assert describe(reply) == 'assistant: Done\\n\\x1b]0;title\\x07 [calls ls({"p": "/"})]'
    result = ToolResultMessage(
        tool_call_id="c1", tool_name="ls", content=[TextContent(text="\x1b[2Jboom")], is_error=True
    )
    assert describe(result) == "tool ls failed: \\x1b[2Jboom"
    denied = result.model_copy(update={"details": {"hitl": {"decision": "human_deny", "reason": "too risky"}}})
    assert describe(denied) == "tool ls denied: \\x1b[2Jboom"  # a person said no; nothing failed
    assert describe(user_text("Go", kind="follow_up")) == "follow-up: Go"
    assert describe(user_text("FYI", kind="note")) == "note: FYI"  # a note is no prompt of the user's
    wait = RetryWait(11.2, "rate\x1b[2J limited", 1, 5)
    assert describe_wait(wait) == "model call: rate\\x1b[2J limited, retrying in 12 s (attempt 2 of 5)"


def test_the_demo_pace_flag_has_the_apps_name_too() -> None:
    from core.runner import parser

    base = ["--db", "x.sqlite", "--thread", "t", "--demo", "hello"]
    assert parser().parse_args([*base, "--demo-speed", "20"]).speed == 20.0
    assert parser().parse_args([*base, "--speed", "3"]).speed == 3.0
    assert parser().parse_args(base).speed == 1.0
