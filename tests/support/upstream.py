"""A gateway's upstream for tests and benches: a real ``fak serve`` (in process, on the tiny or
the real model) behind a recording proxy on loopback that keeps every request body the gateway
forwards, so a test can check what the upstream received (docs/gateway.md, "Witnesses").

    with recording_proxy("http://127.0.0.1:8001") as proxy:
        ...  # point the gateway's upstream url at proxy.url + "/v1"
        proxy.bodies  # every JSON body posted through it, in order
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

# the upstream fak's own policy: it governs nothing, so every call its model writes reaches the
# gateway, whose policy is the one under test
PERMISSIVE_POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: upstream-permissive}
spec:
  mode: enforce
  defaults: {trust: trusted, verdict: ALLOW, max_bytes: 1048576}
  tool_calls: {unlisted: ALLOW, rules: []}
"""


@dataclass
class RecordingProxy:
    url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def texts(self) -> list[str]:
        """Each recorded body as its JSON text (what a substring check reads)."""
        return [json.dumps(b, ensure_ascii=False) for b in self.bodies]


@contextmanager
def recording_proxy(target: str) -> Iterator[RecordingProxy]:
    """A loopback HTTP proxy to ``target`` that records each request's JSON body and headers and
    streams the answer back unchanged (server-sent events included)."""
    client = httpx.Client(base_url=target, trust_env=False, timeout=120)
    record = RecordingProxy("")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and each chunk leave together and at once (without these, a body waits ~40 ms
        # for the client's delayed ACK: Nagle's algorithm on unbuffered writes)
        wbufsize = -1
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def _relay(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            with lock:
                if raw:
                    record.bodies.append(json.loads(raw))
                record.headers.append({k.lower(): v for k, v in self.headers.items()})
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            with client.stream(method, self.path, content=raw, headers=headers) as r:
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() in ("content-type", "location", "retry-after"):
                        self.send_header(k, v)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for part in r.iter_raw():
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._relay("POST")

        def do_GET(self) -> None:  # noqa: N802
            self._relay("GET")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    record.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="recording-proxy")
    thread.start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()
        client.close()
