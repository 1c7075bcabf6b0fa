"""A real webhook receiver on loopback for the approvals webhook's tests: it records each
request (headers, raw body), answers with the statuses it is given in turn, and can hang a
request until released (a receiver that is up but never answers). ``verify`` checks a Standard
Webhooks signature by the spec's own steps, written out here with ``hmac`` so that the test does
not trust the library the server signs with."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    statuses: list[int] = field(default_factory=list)  # answered in turn; 200 once they run out
    hang: threading.Event | None = None  # set: a request waits for it before being answered
    received: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    url: str = ""

    def wait_for(self, n: int, timeout_s: float = 20.0) -> list[Received]:
        """The first ``n`` requests, waiting for them up to ``timeout_s``."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.received) >= n, timeout_s)
            assert len(self.received) >= n, f"{len(self.received)} request(s) arrived, {n} expected"
            return list(self.received)


@contextmanager
def receiving(receiver: Receiver, path: str = "/hooks/fak") -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with receiver.arrived:
                receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.arrived.notify_all()
            if receiver.hang is not None:
                receiver.hang.wait(60)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        yield receiver
    finally:
        if receiver.hang is not None:
            receiver.hang.set()
        server.shutdown()
        server.server_close()


def signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """``v1,`` and the base64 HMAC-SHA256, under the base64-decoded secret (after ``whsec_``), of
    ``id.timestamp.body`` (the Standard Webhooks spec, "Signature scheme")."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, r: Received) -> bool:
    """Whether one of the request's space-separated signatures is the spec's over its body."""
    expected = signature(secret, r.headers["webhook-id"], r.headers["webhook-timestamp"], r.body)
    return any(hmac.compare_digest(expected, s) for s in r.headers["webhook-signature"].split(" "))
