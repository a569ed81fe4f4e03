"""Bad server URLs and unreachable servers: one sentence each, the same reason on both backends.

Opened through the real backends (no fakes). Only the SSL case talks to a server: this
machine's PostgreSQL, which must not offer SSL for it (it is skipped when it does). The
others are refused before any connection, or name port 1 of 127.0.0.1, where nothing
listens; the Redis ones open with ``create=False``, so even a URL wrongly accepted writes nothing.
"""

from __future__ import annotations

import asyncpg
import pytest

from core.checkpoint.addresses import port_problem
from core.checkpoint.postgres import PostgresCheckpointer
from core.checkpoint.redis import RedisCheckpointer
from core.checkpoint.redis_keys import split_url
from core.errors import DatabaseOpenError
from tests.helpers.services import POSTGRES_URL, unavailable


async def _redis_refusal(url: str) -> str:
    with pytest.raises(DatabaseOpenError) as error:
        await RedisCheckpointer.open(url, create=False, prefix="cubepi-test:never-written:")
    return str(error.value)


async def _postgres_refusal(url: str) -> str:
    with pytest.raises(DatabaseOpenError) as error:
        await PostgresCheckpointer.open(url, create=False)
    return str(error.value)


async def test_a_redis_database_that_is_not_a_number_is_refused_not_read_as_database_0() -> None:
    for path, shown in (("abc", "'abc'"), ("-1", "'-1'"), ("0/1", "'0/1'")):
        assert await _redis_refusal(f"redis://127.0.0.1:6379/{path}") == (
            f"Cannot open the Redis store at redis://127.0.0.1:6379/{path}: the database must be a"
            f" non-negative integer such as /0, not {shown}."
        )
    assert (await _redis_refusal("redis://127.0.0.1:6379?db=x")).endswith("such as /0, not 'x'.")


async def test_a_redis_url_without_a_host_or_socket_is_refused_not_sent_to_localhost() -> None:
    for url in ("redis://", "redis://?prefix=team:", "rediss:///0", "redis://me:pw@/0"):
        message = await _redis_refusal(url)
        assert message.endswith(
            ": the URL names no host (redis://host:6379/0, or unix:///path/to/redis.sock for a socket)."
        ), message
        assert "pw" not in message
    assert (await _redis_refusal("unix://?db=0")) == (
        "Cannot open the Redis store at unix://: the URL names no socket (unix:///path/to/redis.sock)."
    )


async def test_a_port_out_of_range_is_one_sentence_on_both_backends() -> None:
    assert await _postgres_refusal("postgresql://me:s3cret@127.0.0.1:99999/threads") == (
        "Cannot open the PostgreSQL database postgresql://me@127.0.0.1:99999/threads:"
        " port 99999 is not a port number (0–65535)."
    )
    assert await _redis_refusal("redis://:s3cret@127.0.0.1:99999/0") == (
        "Cannot open the Redis store at redis://127.0.0.1:99999/0: port 99999 is not a port number (0–65535)."
    )
    assert (await _postgres_refusal("postgresql://127.0.0.1:5x/threads")).endswith(
        ": port '5x' is not a port number (0–65535)."
    )


def test_the_port_rule_reads_every_host_and_leaves_defaults_alone() -> None:
    assert port_problem("postgresql://a:5432,b:70000/db") == "port 70000 is not a port number (0–65535)"
    assert port_problem("postgresql://[::1]:99999/db") == "port 99999 is not a port number (0–65535)"
    assert port_problem("postgresql://u:99999@host/db") is None  # a password, not a port
    for fine in ("postgresql://", "postgresql:///db", "postgresql://[::1]/db", "redis://h:/0", "redis://h:0/0"):
        assert port_problem(fine) is None, fine


def test_a_socket_url_reaches_redis_py_as_unix_slash_slash_and_the_path() -> None:
    assert split_url("unix:///run/redis.sock?prefix=team:", None) == (
        "unix:///run/redis.sock",
        "team:",
        "unix:///run/redis.sock",
    )
    assert split_url("unix:///run/redis.sock?db=2", "p:")[0] == "unix:///run/redis.sock?db=2"
    assert split_url("unix://me:s3cret@/run/redis.sock", None)[0] == "unix://me:s3cret@/run/redis.sock"


async def test_an_unreachable_server_has_the_same_reason_on_both_backends() -> None:
    assert await _postgres_refusal("postgresql://me:s3cret@127.0.0.1:1/threads") == (
        "Cannot open the PostgreSQL database postgresql://me@127.0.0.1:1/threads: the server cannot be reached."
    )
    assert await _redis_refusal("redis://me:s3cret@127.0.0.1:1/0") == (
        "Cannot open the Redis store at redis://me@127.0.0.1:1/0: the server cannot be reached."
    )
    assert await _redis_refusal("unix:///nonexistent/redis.sock") == (
        "Cannot open the Redis store at unix:///nonexistent/redis.sock: the server cannot be reached."
    )


@pytest.mark.postgres
async def test_sslmode_require_against_a_server_without_ssl_says_the_server_refused_ssl() -> None:
    try:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=10, ssl=False)
    except (OSError, asyncpg.PostgresError) as error:
        unavailable("PostgreSQL at " + POSTGRES_URL, error)
        raise
    try:
        ssl_on = await conn.fetchval("SHOW ssl")
    finally:
        await conn.close()
    if ssl_on == "on":
        pytest.skip("this PostgreSQL server offers SSL, so it cannot refuse it")
    shown = POSTGRES_URL.split("?", 1)[0]
    assert await _postgres_refusal(f"{shown}?sslmode=require") == (
        f"Cannot open the PostgreSQL database {shown}: the server refused SSL, which the URL's sslmode requires."
    )
