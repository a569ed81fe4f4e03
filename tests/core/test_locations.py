"""Store locations: a path or a URL picks the backend, CUBEPI_DB is the default, no password is shown.

The server backends here are :mod:`tests.helpers.networked` stores (a memory store behind
a fake connection, retried by the real ``with_reconnect``), put where
:func:`core.checkpoint.locations.open_store` imports the Postgres and Redis backends from,
so what is tested is the real dispatch and the real callers (the app's CLI, the runner).
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from core.checkpoint import locations
from core.checkpoint.capabilities import SchemaUpgrade, supports
from core.checkpoint.locations import (
    chosen_location,
    describe_location,
    is_url,
    open_store,
)
from core.checkpoint.reconnect import RECONNECT_DELAYS, StoreStatus, delays_within
from core.checkpoint.sqlite import SQLiteCheckpointer
from core.errors import DatabaseOpenError
from core.providers.faux import FauxProvider, faux_reply
from core.runner import BAD_INPUT, AgentSpec, _status_printer, run_headless
from core.runner import main as run_main
from tests.helpers import networked
from tui import cli

SECRET = "hunter2"
"""The password in every URL below: it must appear in no message, title or line."""


# --- which backend ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["threads.sqlite", "notes:v2.sqlite", "no-suffix", "agents@host:5432"])
async def test_anything_but_a_url_is_a_sqlite_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    link = networked.install(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for location in (name, tmp_path / name):
        store = await open_store(location, create=True)
        try:
            assert isinstance(store, SQLiteCheckpointer)
            assert store.path == (tmp_path / name).absolute()
        finally:
            await store.close()
    assert link.opened == []


async def test_the_default_file_gets_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "data" / "cubepi-tui" / "threads.sqlite"
    with pytest.raises(DatabaseOpenError):
        await open_store(target, create=True)  # no directory, none made
    store = await open_store(target, create=True, make_parent=True)
    await store.close()
    assert target.is_file()


@pytest.mark.parametrize(
    ("url", "backend", "passed"),
    [
        (f"postgresql://ann:{SECRET}@db.example:5432/agents", "PostgresCheckpointer", None),
        (f"postgres://ann:{SECRET}@db.example/agents", "PostgresCheckpointer", None),
        (f"PostgreSQL://ann:{SECRET}@db.example/agents", "PostgresCheckpointer", "postgresql://"),
        (f"redis://:{SECRET}@cache.example:6379/0", "RedisCheckpointer", None),
        (f"rediss://ann:{SECRET}@cache.example:6380/1", "RedisCheckpointer", None),
        (f"unix:///run/redis.sock?db=0&password={SECRET}", "RedisCheckpointer", None),
        ("REDIS://cache.example", "RedisCheckpointer", "redis://"),
    ],
)
async def test_a_server_url_opens_its_backend_with_create_and_on_status(
    monkeypatch: pytest.MonkeyPatch, url: str, backend: str, passed: str | None
) -> None:
    link = networked.install(monkeypatch)
    seen: list[StoreStatus] = []
    store = await open_store(url, create=False, on_status=seen.append, on_busy=lambda attempt: None)
    assert type(store).__name__ == backend
    ((given, create, on_status),) = link.opened
    # The scheme is lowered for the driver (schemes are case-insensitive); the rest is as typed.
    expected = url if passed is None else passed + url.partition("://")[2]
    assert given == expected and create is False and on_status == seen.append


@pytest.mark.parametrize(
    "url",
    [f"mysql://root:{SECRET}@db.example/agents", "http://example.com/threads", "file:///tmp/threads.sqlite"],
)
async def test_an_unknown_scheme_is_one_sentence_naming_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseOpenError) as caught:
        await open_store(url, create=True)
    sentence = str(caught.value)
    assert len(sentence.splitlines()) == 1 and sentence.endswith(".") and SECRET not in sentence
    assert sentence.startswith(describe_location(url) + " is not a store cubepi-tui can open")
    for scheme in ("postgresql://", "postgres://", "redis://", "rediss://", "unix://"):
        assert scheme in sentence
    assert list(tmp_path.iterdir()) == []  # not taken for a file name


# --- describing a location ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        (f"postgresql://ann:{SECRET}@db.example:5432/agents", "postgresql://ann@db.example:5432/agents"),
        (
            f"postgresql://ann@db.example/agents?sslmode=require&password={SECRET}",
            "postgresql://ann@db.example/agents?sslmode=require",
        ),
        (f"postgresql:///agents?host=/run/postgresql&PASSWORD={SECRET}", "postgresql:///agents?host=/run/postgresql"),
        (f"postgresql://h/agents?sslpassword={SECRET}&sslcert=c.pem", "postgresql://h/agents?sslcert=c.pem"),
        (f"redis://:{SECRET}@cache.example:6379/0", "redis://cache.example:6379/0"),
        (f"rediss://ann:{SECRET}@cache.example/1#x", "rediss://ann@cache.example/1#x"),
        (f"unix:///run/redis.sock?password={SECRET}", "unix:///run/redis.sock"),
        (f"unix://ann:{SECRET}@/run/redis.sock?db=2", "unix://ann@/run/redis.sock?db=2"),
        (f"postgresql://ann:{SECRET}@[::1", "postgresql://ann@[::1"),  # malformed: still no password
        (f"postgresql://ann:p@ss:{SECRET}@db.example/agents", "postgresql://ann@db.example/agents"),
        (f"mysql://root:{SECRET}@db.example/x", "mysql://root@db.example/x"),
        ("postgresql://db.example/agents", "postgresql://db.example/agents"),
        ("threads.sqlite", "threads.sqlite"),
        (Path("/data/threads.sqlite"), "/data/threads.sqlite"),
    ],
)
def test_a_location_is_described_without_its_password(location: str | Path, shown: str) -> None:
    assert describe_location(location) == shown
    assert SECRET not in describe_location(location)


@pytest.mark.parametrize(
    ("location", "url"),
    [
        ("postgresql://h/db", True),
        ("mysql://h/db", True),
        ("a+b.c-d://x", True),
        ("threads.sqlite", False),
        ("./postgresql://x", False),
        ("C://windows/drive", False),
        ("postgresql:/h/db", False),
        (Path("postgresql://h/db"), False),  # a Path is a path, whatever it spells
    ],
)
def test_is_url(location: str | Path, url: bool) -> None:
    assert is_url(location) is url


# --- CUBEPI_DB -------------------------------------------------------------------------------


def _default_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "data" / "cubepi-tui" / "threads.sqlite"
    monkeypatch.setattr(locations, "default_sqlite_path", lambda: target)
    return target


def test_an_argument_beats_cubepi_db_which_beats_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = _default_in(tmp_path, monkeypatch)
    env = {"CUBEPI_DB": "redis://cache.example/0"}
    assert chosen_location("given.sqlite", env) == locations.ChosenLocation("given.sqlite", False)
    assert chosen_location(Path("given.sqlite"), env) == locations.ChosenLocation(Path("given.sqlite"), False)
    assert chosen_location(None, env) == locations.ChosenLocation("redis://cache.example/0", False)
    assert chosen_location("", env) == locations.ChosenLocation("", False)  # refused when opened, not the default
    assert chosen_location(None, {"CUBEPI_DB": "  "}) == locations.ChosenLocation(default, True)
    assert chosen_location(None, {}) == locations.ChosenLocation(default, True)
    monkeypatch.setenv("CUBEPI_DB", "from-os.sqlite")
    assert chosen_location(None).location == "from-os.sqlite"  # os.environ by default


async def test_the_app_takes_cubepi_db_unless_given_a_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = _default_in(tmp_path, monkeypatch)
    link = networked.install(monkeypatch)
    assert cli.build_session(cli.parse_args([]).database, demo=True).config.location == str(default)

    monkeypatch.setenv("CUBEPI_DB", f"postgresql://ann:{SECRET}@db.example/agents")
    session = cli.build_session(cli.parse_args([]).database, demo=True)
    assert session.config.location == "postgresql://ann@db.example/agents"  # what the title shows
    await session.open()
    try:
        assert link.opened[0][0] == f"postgresql://ann:{SECRET}@db.example/agents"  # the driver gets it all
        assert link.opened[0][1] is True  # created on first use
        assert session.store is link.stores[0]
    finally:
        await session.close()

    given = tmp_path / "given.sqlite"
    session = cli.build_session(cli.parse_args([str(given)]).database, demo=True)
    assert session.config.location == str(given)
    await session.open()
    await session.close()
    assert given.is_file() and len(link.opened) == 1 and not default.exists()


@pytest.mark.parametrize("where", ["argument", "CUBEPI_DB"])
def test_the_app_refuses_an_unknown_scheme_before_starting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    url = f"mysql://root:{SECRET}@db.example/agents"
    if where == "CUBEPI_DB":
        monkeypatch.setenv("CUBEPI_DB", url)
    with pytest.raises(SystemExit) as exited:
        cli.main([url] if where == "argument" else [])
    err = capsys.readouterr().err
    assert exited.value.code == BAD_INPUT
    assert err.startswith("cubepi-tui: mysql://root@db.example/agents is not a store")
    assert len(err.strip().splitlines()) == 1 and SECRET not in err


def test_a_libpq_keyword_string_is_refused_not_taken_for_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "host=... password=..." is libpq's other form: as a SQLite path it would become a file
    # named after the password, and the title would show it.
    monkeypatch.chdir(tmp_path)
    dsn = f"host=127.0.0.1 dbname=threads user=postgres password={SECRET}"
    with pytest.raises(SystemExit) as exited:
        cli.main([dsn])
    err = capsys.readouterr().err
    assert exited.value.code == BAD_INPUT
    assert "looks like a PostgreSQL keyword connection string" in err and "postgresql://" in err
    assert len(err.strip().splitlines()) == 1 and SECRET not in err
    assert run_main(["run", "--db", dsn, "--thread", "t1", "--demo", "hi"]) == BAD_INPUT
    out, err = capsys.readouterr()
    assert "keyword connection string" in err and SECRET not in out + err
    assert list(tmp_path.iterdir()) == []  # no file made
    assert describe_location("/srv/a b=c.sqlite") == "/srv/a b=c.sqlite"  # one "=" word is still a path


def test_the_runner_takes_cubepi_db_unless_given_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = _default_in(tmp_path, monkeypatch)
    run = ["run", "--thread", "t1", "--demo", "--speed", "50", "hi"]
    assert run_main(run) == 0
    assert default.is_file()  # neither: the default file, its directory made

    from_env, given = tmp_path / "env.sqlite", tmp_path / "given.sqlite"
    monkeypatch.setenv("CUBEPI_DB", str(from_env))
    assert run_main(run) == 0
    assert from_env.is_file() and not given.exists()
    assert run_main([*run[:1], "--db", str(given), *run[1:]]) == 0
    assert given.is_file()


def test_the_runner_refuses_an_unknown_scheme_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUBEPI_DB", f"http://ann:{SECRET}@example.com/")
    assert run_main(["run", "--thread", "t1", "--demo", "hi"]) == BAD_INPUT
    out, err = capsys.readouterr()
    assert err.startswith("http://ann@example.com/ is not a store cubepi-tui can open")
    assert len(err.strip().splitlines()) == 1 and SECRET not in out + err


def test_an_empty_store_location_is_refused_not_taken_for_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    default = _default_in(tmp_path, monkeypatch)
    monkeypatch.setenv("CUBEPI_DB", str(tmp_path / "env.sqlite"))
    sentence = (
        "The store location is empty; give a SQLite file path or a store URL, or leave it out for the default store."
    )
    for given in ("", "  "):
        assert run_main(["run", "--db", given, "--thread", "t1", "--demo", "hi"]) == BAD_INPUT
        assert capsys.readouterr().err == sentence + "\n"
        with pytest.raises(SystemExit) as exited:
            cli.main([given])
        assert exited.value.code == BAD_INPUT
        assert capsys.readouterr().err == f"cubepi-tui: {sentence}\n"
    assert list(tmp_path.iterdir()) == []  # neither the default file nor $CUBEPI_DB's was made
    assert not default.exists()


# --- the runner on a server store ------------------------------------------------------------


async def test_the_runner_prints_each_reconnect_and_the_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    link = networked.install(monkeypatch, networked.Link(fail_next=3))
    out, err = io.StringIO(), io.StringIO()
    url = f"postgresql://ann:{SECRET}@db.example/agents"
    status = await run_headless(url, "t1", "hi", demo=True, speed=50, out=out, err=err)
    assert status == 0, err.getvalue()
    lines = err.getvalue().splitlines()
    reason = "ConnectionResetError: the server closed the connection unexpectedly"
    assert lines == [
        *(
            f"store: reconnecting to postgresql://ann@db.example/agents (attempt {n}, next in 0.1 s)…: {reason}"
            for n in (1, 2, 3)
        ),
        "store: reconnected to postgresql://ann@db.example/agents",
    ]
    assert out.getvalue().splitlines()[-1] == "run completed"
    assert SECRET not in out.getvalue() + err.getvalue()
    data = await link.stores[0].load("t1")
    assert data is not None and data.messages[0].text == "hi"


async def test_the_runner_exits_1_with_one_sentence_when_the_server_stays_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    networked.install(monkeypatch, networked.Link(down=True, delays=(0.01, 0.02)))
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless(
        f"redis://:{SECRET}@cache.example:6379/0", "t1", "hi", demo=True, speed=50, out=out, err=err
    )
    assert status == 1
    *notices, sentence = err.getvalue().splitlines()
    assert [n.partition(" (")[0] for n in notices] == ["store: reconnecting to redis://cache.example:6379/0"] * 2
    assert sentence.startswith("Lost the connection to redis://cache.example:6379/0 and could not get it back")
    assert out.getvalue() == "" and SECRET not in err.getvalue()


async def test_a_server_gone_mid_run_is_one_sentence_on_stderr_not_a_traceback_per_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once the server stayed away, the heartbeat, the live events, the journal and the lease
    # release each logged a warning with its traceback to stderr, and no sentence said why.
    link = networked.install(monkeypatch, networked.Link(delays=(0.01, 0.02)))
    out, err = io.StringIO(), io.StringIO()
    url = f"postgresql://ann:{SECRET}@db.example/agents"
    running = asyncio.ensure_future(run_headless(url, "t1", "hi", demo=True, speed=5, out=out, err=err))
    deadline = asyncio.get_running_loop().time() + 60
    while not (link.stores and (data := await link.stores[0].load("t1")) and len(data.messages) >= 2):
        assert not running.done() and asyncio.get_running_loop().time() < deadline, err.getvalue()
        await asyncio.sleep(0.01)
    link.down = True  # the first tools are running: the server goes away for good
    status = await asyncio.wait_for(running, 60)
    assert status == 1
    *notices, sentence = err.getvalue().splitlines()
    assert all(n.startswith("store: reconnecting to postgresql://ann@db.example/agents (attempt ") for n in notices)
    assert sentence.startswith("Lost the connection to postgresql://ann@db.example/agents and could not get it back")
    assert "Traceback" not in err.getvalue() and SECRET not in err.getvalue() + out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("run failed: Could not save a message")


def test_a_shorter_reconnect_wait_keeps_the_first_steps_and_cuts_the_last() -> None:
    assert delays_within(2.0) == (0.1, 0.2, 0.4, 0.8, 0.5)
    assert delays_within(0.05) == (0.05,)
    assert delays_within(sum(RECONNECT_DELAYS)) == RECONNECT_DELAYS == delays_within(1000.0)
    for wait in (0.3, 1.5, 7.0, 20.0):
        assert sum(delays_within(wait)) == pytest.approx(wait)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="above zero"):
            delays_within(bad)


def test_the_runner_passes_its_reconnect_wait_to_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[dict[str, object]] = []

    async def fake_open(location: str, **options: object) -> object:
        opened.append(options)
        raise DatabaseOpenError("Not this time.")

    monkeypatch.setattr("core.runner.open_store", fake_open)
    assert (
        run_main(["run", "--db", "redis://h:6379/0", "--thread", "t", "--demo", "--reconnect-wait", "3", "hi"])
        == BAD_INPUT
    )
    assert run_main(["run", "--db", "redis://h:6379/0", "--thread", "t", "--demo", "hi"]) == BAD_INPUT
    assert [o["reconnect_wait"] for o in opened] == [3.0, None]


async def test_a_reconnect_wait_not_above_zero_is_refused_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    link = networked.install(monkeypatch)
    with pytest.raises(ValueError, match="above zero"):
        await open_store("redis://h:6379/0", create=False, reconnect_wait=0)
    assert link.opened == []


# --- upgrading ---------------------------------------------------------------------------------


async def test_each_store_explains_its_own_upgrade(monkeypatch: pytest.MonkeyPatch, fixture_db: Path) -> None:
    networked.install(monkeypatch, networked.Link(needs_upgrade=True))
    sqlite_store = await open_store(fixture_db, create=False)  # cubeloop's file: browse-only
    server_store = await open_store("postgresql://db.example/agents", create=False)
    try:
        for store in (sqlite_store, server_store):
            assert supports(store, SchemaUpgrade) and store.needs_upgrade
        sqlite_words, server_words = sqlite_store.upgrade_explanation, server_store.upgrade_explanation
    finally:
        await sqlite_store.close()
        await server_store.close()
    assert "WAL" in sqlite_words and "tables" in sqlite_words  # a file: its journal mode changes too
    assert "WAL" not in server_words and "file" not in server_words  # the default words, true of any store
    for words in (sqlite_words, server_words):
        assert words.endswith("Upgrade now?") and "browsing only" in words


async def test_the_runner_never_prints_a_reply_the_store_did_not_take_as_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    link = networked.install(monkeypatch, networked.Link(delays=(0.01, 0.02)))

    def reply_then_lose_the_server(request: object) -> object:
        link.down = True  # the prompt is saved; the reply's append finds the server gone
        return faux_reply("You asked: hi")

    spec = AgentSpec(provider=FauxProvider(fallback=reply_then_lose_the_server))  # type: ignore[arg-type]
    out, err = io.StringIO(), io.StringIO()
    status = await run_headless("postgresql://db.example/agents", "t1", "hi", agent=lambda: spec, out=out, err=err)
    assert status == 1, err.getvalue()
    printed = out.getvalue().splitlines()
    assert printed[0] == "user: hi"
    assert "assistant: You asked: hi (not saved)" in printed, printed
    assert "assistant: You asked: hi" not in printed
    link.down = False
    data = await link.stores[0].load("t1")
    assert data is not None and [m.text for m in data.messages] == ["hi"]


def test_calls_waiting_out_one_outage_together_say_each_attempt_once() -> None:
    # A write, the heartbeat and the live events of one run each retry on their own: the
    # runner's stderr still reads attempt 1, 2, ... once each, then the recovery.
    err = io.StringIO()
    on_status = _status_printer(err, "redis://cache.example:6379/0")
    for attempt, delay in ((1, 0.1), (1, 0.1), (2, 0.2), (1, 0.1), (2, 0.2), (3, 0.4)):
        on_status(StoreStatus(True, attempt, delay, "ConnectionError: gone"))
    on_status(StoreStatus(False))
    on_status(StoreStatus(False))  # a second call's own recovery: said again, harmless
    on_status(StoreStatus(True, 1, 0.1, "ConnectionError: gone"))  # a new outage starts at 1 again
    lines = err.getvalue().splitlines()
    assert [line.partition(" (attempt ")[2][:1] or line for line in lines] == [
        "1",
        "2",
        "3",
        "store: reconnected to redis://cache.example:6379/0",
        "store: reconnected to redis://cache.example:6379/0",
        "1",
    ]
