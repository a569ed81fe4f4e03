"""`cubepi-tui run` refuses bad arguments with one sentence in the user's own terms."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.checkpoint.base import thread_unavailable
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.messages import AssistantMessage, TextContent, user_text
from core.owners import default_owner
from core.runner import BAD_INPUT, main, plain


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--speed", "0"], "Argument --speed: expected a number above zero, not '0'"),
        (["--speed", "-1"], "Argument --speed: expected a number above zero, not '-1'"),
        (["--speed", "nan"], "Argument --speed: expected a number above zero, not 'nan'"),
        (["--lease-ttl", "0"], "Argument --lease-ttl: expected a number above zero, not '0'"),
        (["--heartbeat", "20"], "--heartbeat (20 s) must be positive and shorter than --lease-ttl (15 s)."),
    ],
)
def test_a_bad_pace_or_duration_is_one_sentence_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], words: str
) -> None:
    code = main(["run", "--db", str(tmp_path / "t.sqlite"), "--thread", "t1", "--demo", *flags, "hi"])
    err = capsys.readouterr().err.strip()
    assert code == BAD_INPUT and words in err and len(err.splitlines()) == 1, err


def test_resuming_an_unknown_thread_says_there_is_no_such_thread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "t.sqlite"
    code = main(["run", "--db", str(db), "--thread", "nosuch", "--resume", "--demo"])
    err = capsys.readouterr().err.strip()
    assert code == BAD_INPUT and err == str(thread_unavailable("nosuch", default_owner()))


@pytest.mark.parametrize("prompt", ["", "   "])
def test_an_empty_prompt_is_refused_by_the_agents_own_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], prompt: str
) -> None:
    db = tmp_path / "t.sqlite"
    code = main(["run", "--db", str(db), "--thread", "t1", "--demo", prompt])
    err = capsys.readouterr().err.strip()
    assert code == BAD_INPUT and err == "The prompt is empty; type some text to send."
    assert not db.exists()  # refused before anything was opened


@pytest.mark.parametrize("thread_id", ["x\x1b[31my", "a\tb", "right\u202eleft"])
def test_a_new_thread_id_with_a_control_character_is_refused_as_an_owner_name_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], thread_id: str
) -> None:
    db = tmp_path / "t.sqlite"
    for start in ([], ["--start"]):
        code = main(["run", "--db", str(db), "--thread", thread_id, "--demo", *start, "hi"])
        err = capsys.readouterr().err.strip()
        assert code == BAD_INPUT and err == plain(f"The thread id {thread_id!r} holds a control character.")


async def test_a_stored_thread_whose_id_holds_a_control_character_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, thread_id = tmp_path / "t.sqlite", "x\x1b[31my"
    store = await SQLiteCheckpointer.open(db)  # as cubeloop writes: any id
    done = AssistantMessage(content=[TextContent(text="Done.")], stop_reason="stop")
    await store.append(thread_id, [user_text("hi"), done])
    await store.close()
    code = await asyncio.to_thread(main, ["run", "--db", str(db), "--thread", thread_id, "--demo", "again"])
    assert code == 0, capsys.readouterr().err
