"""``fak serve`` in a process of its own on a loopback port: started, waited for, stopped or
killed. One wrapper for the tests that run the real CLI server (test_cli_serving.py) and for
bench/load.py (bench puts tests/ on its path: a fixture folder).

    server = ServeProcess(env, tmp_path / "server.log")  # starts it
    server.wait_up()  # /healthz answers 200, else ServerDown quoting the log
    server.stop()  # SIGTERM, then SIGKILL after 60 s
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

FAK = str(Path(sys.executable).with_name("fak"))


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerDown(RuntimeError):
    """The server exited, or did not answer ``/healthz`` in time (the message quotes its log)."""


class ServeProcess:
    """``fak serve`` on ``port`` (a free one by default) with ``env``; its stderr goes to ``log``."""

    def __init__(self, env: dict[str, str], log: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.started = time.monotonic()
        self.proc = subprocess.Popen([FAK, "serve", "--port", str(self.port), "--log-level", "warning"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=open(log, "ab"))  # noqa: SIM115

    def wait_up(self, timeout: float = 240) -> float:
        """Seconds from the start until ``/healthz`` answered 200."""
        while time.monotonic() - self.started < timeout:
            if self.proc.poll() is not None:
                raise ServerDown(f"the server exited ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                if httpx.get(self.base + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServerDown(f"the server did not come up:\n{self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL (no clean stop) and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, a minute to stop cleanly, then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
