"""A real uvicorn server on 127.0.0.1 (a free port, a background thread) around
``create_app(kernel)``, for API tests that go through sockets, HTTP parsing and
streaming as a client does.

    from api_server import live_server  # noqa: F401  (the fixture)

    def test_x(live_server):
        key = live_server.key("acme", "agent")
        with live_server.client(key) as c:
            assert c.get("/v1/sessions").status_code == 200

``live_server`` wraps the ``kernel`` fixture of conftest.py (override ``settings`` or
``kernel`` in a test module to change it); ``serve(kernel, **create_app_options)`` is the
same as a context manager, for a second server or other app options (``max_body``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

START_TIMEOUT_S = 15.0


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:<port>
    kernel: object  # fak.Kernel
    app: object  # the FastAPI app
    server: uvicorn.Server = field(repr=False)
    thread: threading.Thread = field(repr=False)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def key(self, tenant: str, role: str) -> str:
        """A new API key for ``tenant`` with ``role`` (agent | auditor | admin)."""
        return self.app.state.keys.create(tenant, role)[0]

    def client(self, key: str | None = None, **options: object) -> httpx.Client:
        """An httpx client on this server (no proxies from the environment), with ``key``
        sent as ``Authorization: Bearer`` when given."""
        headers = dict(options.pop("headers", None) or {})  # type: ignore[arg-type]
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        options.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, headers=headers, trust_env=False, **options)  # type: ignore[arg-type]


def _free_socket() -> socket.socket:
    """A socket bound to a free loopback port (no port race: uvicorn listens on it). The
    protocol is named: asyncio sets TCP_NODELAY on accepted connections only when the
    listening socket says IPPROTO_TCP (proto 0 costs a 40 ms delayed-ACK stall per response)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serve(kernel, **app_options: object) -> Iterator[LiveServer]:  # noqa: ANN001 - fak.Kernel
    """Run ``create_app(kernel, **app_options)`` on uvicorn until the block ends."""
    from fak.api.app import create_app

    app = create_app(kernel, **app_options)
    sock = _free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=3, timeout_keep_alive=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    live = LiveServer(f"http://127.0.0.1:{port}", kernel, app, server, thread)
    try:
        _wait_ready(live)
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        if thread.is_alive():  # pragma: no cover - a hung shutdown is a test failure, not a hang
            server.force_exit = True
            thread.join(timeout=5)
            raise RuntimeError(f"uvicorn on {live.url} did not stop")


def _wait_ready(live: LiveServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=live.url, trust_env=False, timeout=1.0) as c:
        while True:
            if not live.thread.is_alive():
                raise RuntimeError(f"uvicorn on {live.url} exited while starting")
            try:
                if c.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn on {live.url} did not answer /healthz in {START_TIMEOUT_S} s")
            time.sleep(0.02)


@pytest.fixture
def live_server(kernel) -> Iterator[LiveServer]:  # noqa: ANN001
    """A real uvicorn server on 127.0.0.1 around ``create_app(kernel)``; stopped after the test."""
    with serve(kernel) as live:
        yield live
