"""The local PostgreSQL server the storage suites run against (127.0.0.1:5432, database
``test``): its URL, skipping (saying why) only when no server answers, and scratch DDL."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_HOST, PG_PORT, PG_DB = "127.0.0.1", 5432, "test"


def _pg_answers() -> bool:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=1.0):
            return True
    except OSError:
        return False


def pg_server_url(database: str = PG_DB) -> str:
    """The URL of ``database`` on the local PostgreSQL server; skips (saying why) only when
    no server answers."""
    if not _pg_answers():
        pytest.skip(f"PostgreSQL: no server answers at {PG_HOST}:{PG_PORT}; PostgreSQL tests skipped")
    user = os.environ.get("FAK_PG_USER", "postgres")
    return f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{database}"


@contextmanager
def pg_scratch(create: str, drop: str) -> Iterator[None]:
    """Runs ``create`` (DDL: a schema, a database) on the server's ``test`` database, and ``drop``
    afterwards; autocommit, as ``CREATE DATABASE`` needs."""
    import sqlalchemy as sa

    admin = sa.create_engine(pg_server_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(create))
    try:
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(drop))
        admin.dispose()
