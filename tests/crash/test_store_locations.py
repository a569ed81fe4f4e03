"""The location strings crash children get, and when a server backend's run skips or fails."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from core.checkpoint.capabilities import SupervisedStore, supports
from core.messages import user_text
from tests.helpers.store_backends import require_backend
from tests.helpers.store_locations import (
    BACKEND_MODULES,
    backend_of,
    open_location,
    redis_location,
    split_redis_location,
)


def test_a_redis_location_carries_its_prefix_and_keeps_the_url() -> None:
    url = "redis://user:pw@127.0.0.1:6379/2?socket_timeout=5"
    prefix = "cubepi-test:crash?&=:a b/"
    location = redis_location(url, prefix)
    assert backend_of(location) == "redis"
    assert split_redis_location(location) == (url, prefix)
    assert split_redis_location("redis://127.0.0.1:6379/0") == ("redis://127.0.0.1:6379/0", None)


def test_locations_name_their_backend() -> None:
    assert backend_of("postgresql://postgres@127.0.0.1:5432/x") == "postgres"
    assert backend_of("postgres://postgres@127.0.0.1:5432/x") == "postgres"
    assert backend_of("rediss://127.0.0.1:6380/0") == "redis"
    assert backend_of("/tmp/agents.sqlite") == "sqlite"
    assert backend_of("agents.sqlite") == "sqlite"


async def test_a_sqlite_location_opens_one_store_for_every_process(tmp_path: Path) -> None:
    location = str(tmp_path / "agents.sqlite")
    first = await open_location(location, create=True)
    second = await open_location(location, create=False)
    try:
        assert supports(first, SupervisedStore) and supports(second, SupervisedStore)
        await first.append("t", [user_text("hello")])
        data = await second.load("t")
        assert data is not None and [m.text for m in data.messages] == ["hello"]
    finally:
        await first.close()
        await second.close()


def _fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str | None) -> None:
    """Point the ``postgres`` backend at a module that raises ImportError (``source``) or at none."""
    name = f"cubepi_fake_backend_{uuid.uuid4().hex}"
    if source is not None:
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BACKEND_MODULES, "postgres", name)
    monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("required", ["0", "1"])
def test_a_backend_not_written_yet_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, required: str) -> None:
    monkeypatch.setenv("CUBEPI_REQUIRE_SERVICES", required)
    _fake_backend(tmp_path, monkeypatch, None)
    with pytest.raises(pytest.skip.Exception, match="cannot be imported: ModuleNotFoundError"):
        require_backend("postgres")


def test_a_backend_that_fails_to_import_skips_unless_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_backend(tmp_path, monkeypatch, "import cubepi_no_such_driver_module\n")
    monkeypatch.setenv("CUBEPI_REQUIRE_SERVICES", "0")
    with pytest.raises(pytest.skip.Exception, match="cubepi_no_such_driver_module"):
        require_backend("postgres")
    monkeypatch.setenv("CUBEPI_REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match="CUBEPI_REQUIRE_SERVICES=1 needs it"):
        require_backend("postgres")


def test_an_importable_backend_and_sqlite_neither_skip_nor_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_backend(tmp_path, monkeypatch, "VALUE = 1\n")
    for required in ("0", "1"):
        monkeypatch.setenv("CUBEPI_REQUIRE_SERVICES", required)
        require_backend("postgres")  # a skip or a failure raises here
        require_backend("sqlite")
