"""PostgreSQL stores for tests: each on its own new database, dropped when the store closes.

Creating our schema takes over a second (128 partitions and their triggers), so each test
process creates it once, in a template database made by ``PostgresCheckpointer.open(create=True)``
itself, and every test database is a copy of it (``CREATE DATABASE ... TEMPLATE``, ~0.1 s).
"""

from __future__ import annotations

import asyncio
import atexit
import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any

from core.checkpoint.postgres import PostgresCheckpointer
from tests.helpers.services import POSTGRES_URL, postgres_database, postgres_url_for

_template: str | None = None


class DroppingStore(PostgresCheckpointer):
    """A ``PostgresCheckpointer`` whose ``close`` also drops the test database it was opened on."""

    _database: AbstractAsyncContextManager[str] | None = None
    database_url: str = ""
    """The URL of the test database it was opened on, to open more stores on the same data."""

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            database, self._database = self._database, None
            if database is not None:
                await database.__aexit__(None, None, None)


async def new_store(label: str = "store", **options: Any) -> DroppingStore:
    """A store on a fresh database holding our schema (its URL in ``database_url``); closing
    it drops the database. ``options`` go to ``open`` (e.g. ``owner=``). Skips (or fails
    under ``CUBEPI_REQUIRE_SERVICES=1``) when the server is unreachable."""
    database = postgres_database(label, template=await _schema_template())
    url = await database.__aenter__()
    try:
        store = await DroppingStore.open(url, create=False, **options)
    except BaseException:
        await database.__aexit__(None, None, None)
        raise
    store._database = database
    store.database_url = url
    return store


async def _schema_template() -> str:
    global _template
    if _template is None:
        import asyncpg

        name = f"cubepi_template_{uuid.uuid4().hex[:12]}"
        try:
            admin = await asyncpg.connect(POSTGRES_URL, timeout=10)
        except (OSError, asyncpg.PostgresError) as error:
            from tests.helpers.services import unavailable

            unavailable("PostgreSQL at " + POSTGRES_URL, error)
            raise
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        store = await PostgresCheckpointer.open(postgres_url_for(name), create=True)
        await store.close()
        _template = name
        atexit.register(_drop_template, name)
    return _template


def _drop_template(name: str) -> None:
    import asyncpg

    async def drop() -> None:
        admin = await asyncpg.connect(POSTGRES_URL, timeout=10)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        finally:
            await admin.close()

    try:
        asyncio.run(drop())
    except Exception:
        pass  # the server went away first: nothing to drop


def cubeloop_schema_statements() -> list[str]:
    """cubeloop 0.15.3's own v5 schema, as a host's migration makes it: ``cubeloop_metadata``
    compiled by SQLAlchemy's postgresql dialect (tables, then their indexes), the child
    partitions from ``alembic_helpers`` (messages and runs) and its version row."""
    from cubeloop.checkpointer.postgres import alembic_helpers, cubeloop_metadata
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = postgresql.dialect()
    statements = []
    for table in cubeloop_metadata.sorted_tables:
        statements.append(str(CreateTable(table).compile(dialect=dialect)))
        statements.extend(str(CreateIndex(index).compile(dialect=dialect)) for index in table.indexes)
    statements.append(alembic_helpers.create_message_partitions_op())
    statements.append(alembic_helpers.create_runs_partitions_op())
    statements.append(alembic_helpers.write_schema_version_op())
    return statements


async def make_cubeloop_schema(url: str) -> None:
    """Create cubeloop's schema (:func:`cubeloop_schema_statements`) in the database at ``url``."""
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        async with conn.transaction():
            for statement in cubeloop_schema_statements():
                await conn.execute(statement)
    finally:
        await conn.close()
