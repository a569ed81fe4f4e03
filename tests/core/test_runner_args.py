"""`cubepi-tui run` refuses bad arguments with one sentence in the user's own terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.checkpoint.base import thread_unavailable
from core.owners import default_owner
from core.runner import BAD_INPUT, main


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
