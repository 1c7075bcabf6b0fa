"""Run the API on uvicorn in a background thread (the demo, tests, benchmarks):
``with serve(kernel) as live: live.url``. ``fak serve`` runs uvicorn in the foreground."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

START_TIMEOUT_S = 15.0


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:<port>
    kernel: Any  # fak.Kernel
    app: Any  # the FastAPI app
    server: uvicorn.Server = field(repr=False)
    thread: threading.Thread = field(repr=False)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def key(self, tenant: str, role: str) -> str:
        """A new API key for ``tenant`` with ``role`` (agent | auditor | admin)."""
        key: str = self.app.state.keys.create(tenant, role)[0]
        return key

    def client(self, key: str | None = None, **options: Any) -> httpx.Client:
        """An httpx client on this server (no proxies from the environment), with ``key``
        sent as ``Authorization: Bearer`` when given."""
        headers = dict(options.pop("headers", None) or {})
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        options.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, headers=headers, trust_env=False, **options)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound socket (no port race: uvicorn listens on it). The protocol is named:
    asyncio sets TCP_NODELAY on accepted connections only when the listening socket says
    IPPROTO_TCP (proto 0 costs a 40 ms delayed-ACK stall per keep-alive response)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextlib.contextmanager
def serve(kernel: Any, host: str = "127.0.0.1", port: int = 0, **app_options: Any) -> Iterator[LiveServer]:
    """Run ``create_app(kernel, **app_options)`` on uvicorn until the block ends."""
    from fak.api.app import create_app

    app = create_app(kernel, **app_options)
    sock = _listening_socket(host, port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=3, timeout_keep_alive=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    live = LiveServer(f"http://{host}:{port}", kernel, app, server, thread)
    try:
        _wait_ready(live)
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        if thread.is_alive():
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
