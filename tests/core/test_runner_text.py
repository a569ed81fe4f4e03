"""The headless runner's output lines: model and tool text can never drive the terminal."""

from __future__ import annotations

from core.runner import plain
from tui.text import clean


def test_bidi_overrides_and_isolates_are_escaped_like_control_characters() -> None:
    assert plain("ok\u202egnp.exe\u2066x\u2069") == "ok\\u202egnp.exe\\u2066x\\u2069"
    assert plain("line\u2028sep") == "line\\u2028sep"
    assert plain("héllo wörld ✓") == "héllo wörld ✓"  # other non-ASCII text is kept


def test_the_runner_and_the_app_hide_exactly_the_same_characters() -> None:
    # One rule (core.untrusted.UNSAFE) for both places text is shown: a character one of
    # them lets through raw must be let through by the other too. The app used to let the
    # line and paragraph separators through, which split a row of the screen in two.
    for code in [*range(0x00, 0xA0), *range(0x2000, 0x2070), 0xD800, 0xDCFF, 0xDFFF]:
        char = chr(code)
        if char in "\n\t":
            continue
        assert (char in plain(f"a{char}b")) == (char in clean(f"a{char}b")), f"U+{code:04X}"


async def test_qa9_a_stored_workflow_version_never_reaches_the_terminal_raw(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """QA (issue 9): the workflow version is stored text (any writer of the thread set it),
    and the runner's refusal names it ("workflow: OLD -> NEW"). The app shows it escaped;
    the runner must too, like every other stored text it prints (core.untrusted)."""
    import dataclasses
    import io

    from core.checkpoint.locations import open_store
    from core.runner import BAD_INPUT, run_headless

    db = tmp_path / "threads.sqlite"
    hostile = "v1\x1b[2J\x1b]0;pwned\x07\u202e"
    out, err = io.StringIO(), io.StringIO()
    # `--workflow` refuses such a version now (check_workflow), but the store holds what any
    # writer gave it (an older cubepi-tui, another program): put it there as one would.
    assert await run_headless(db, "t1", "hi", demo=True, speed=50, owner="alice", workflow="v1", out=out, err=err) == 0
    store = await open_store(db, create=False, owner="alice")
    try:
        meta = await store.load_meta("t1")
        assert meta is not None and meta.fingerprints is not None
        await store.save_fingerprints(
            "t1", dataclasses.replace(meta.fingerprints, workflow=hostile), expected_revision=meta.revision
        )
    finally:
        await store.close()
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless(db, "t1", "again", demo=True, speed=50, owner="alice", workflow="2", out=out, err=err)
    assert status == BAD_INPUT
    said = err.getvalue()
    assert "workflow: " in said  # the refusal names the change
    assert "\x1b" not in said and "\x07" not in said and "\u202e" not in said, repr(said)


async def test_a_hostile_workflow_on_the_command_line_is_refused_in_one_escaped_sentence(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import io

    from core.runner import BAD_INPUT, run_headless

    db = tmp_path / "threads.sqlite"
    out, err = io.StringIO(), io.StringIO()
    hostile = "v1\x1b]0;pwned\x07"
    status = await run_headless(db, "t1", "hi", demo=True, speed=50, owner="alice", workflow=hostile, out=out, err=err)
    assert status == BAD_INPUT and out.getvalue() == ""
    (line,) = err.getvalue().splitlines()
    assert line == "The workflow version 'v1\\x1b]0;pwned\\x07' holds a control character.", repr(line)
    assert not db.exists()  # refused before the store was opened


def test_everything_the_runner_prints_passes_plain_once_and_for_all() -> None:
    """The runner's one output path (``say``) escapes whatever it is given, so a sentence
    made from stored text (an error naming a host, a thread id) is as safe as a message."""
    import io

    from core.runner import say

    out = io.StringIO()
    say(out, "Thread 'x' is running on box\x1b[31m\u202e (pid 1)\nsecond line")
    assert out.getvalue() == "Thread 'x' is running on box\\x1b[31m\\u202e (pid 1)\\nsecond line\n"
