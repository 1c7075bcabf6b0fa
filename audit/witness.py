"""A witness (C2SP tlog-witness over HTTP) and the log's client for it.

Why: a log's own key proves only that the log signed something. A witness is a separate
process, with its own Ed25519 key and its own fsynced memory of the last (size, root) it
cosigned per log origin, that cosigns a checkpoint only after verifying a consistency proof
from that remembered tree. A log rewritten behind its signer's back (or by an operator with
the key) cannot get a cosignature on the rewritten history from a witness that saw the old
one, so verifiers with a witness quorum see the split. https://c2sp.org/tlog-witness

``POST <prefix>/add-checkpoint`` with ``old <size>``, the proof lines, a blank line and the
signed checkpoint answers the cosignature line (200), or 400 (malformed, old > size), 403
(no valid trusted signature), 404 (unknown origin), 409 (old size is not the witness's;
body ``<size>\\n``, ``text/x.tlog.size``) or 422 (bad proof, bad empty tree). ``GET
<prefix>/<sha256(origin) hex>/checkpoint`` serves the last cosigned checkpoint.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit

from fak.audit import merkle, note
from fak.audit.checkpoint import parse_body
from fak.audit.cosignature import CosignerKey, cosign, matches, split_note, verify_cosignature
from fak.audit.errors import AuditError, VerificationError
from fak.audit.signer_state import atomic_write, locked

KEY_FILE = "witness.key"
STATE_FILE = "witness.state"
DEFAULT_NAME = "fak.local/witness"
MAX_BODY = 64 * 1024
MAX_PROOF_LINES = 63
SIZE_TYPE = "text/x.tlog.size"
_OLD = re.compile(r"^old (0|[1-9][0-9]{0,18})$")


# ------------------------------------------------------------------------------------------ the witness


class _Record(TypedDict):
    """What the witness state file keeps per log origin: the newest checkpoint it cosigned."""

    size: int
    root: str  # base64
    checkpoint: str  # the signed note with this witness's cosignature line


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def _text(status: int, msg: str) -> Answer:
    return Answer(status, (msg + "\n").encode())


def load_key(directory: Path, name: str | None = None) -> CosignerKey:
    """The witness key in ``directory`` (created on first start, mode 0600)."""
    path = Path(directory) / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (CosignerKey.generate(name or DEFAULT_NAME).skey() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    key = CosignerKey.parse(path.read_text())
    if name is not None and key.name != name:
        raise AuditError(f"witness key in {path} is named {key.name!r}, not {name!r}")
    return key


class Witness:
    """Cosigns checkpoints of the logs it trusts (origin -> log verifier keys); remembers,
    per origin, the last size and root it cosigned in ``<dir>/witness.state`` (fsynced
    before answering), so a restart never forgets what it vouched for."""

    def __init__(self, directory: str | Path, logs: list[str], name: str | None = None) -> None:
        self.dir = Path(directory)
        self.key = load_key(self.dir, name)
        self.logs: dict[str, list[note.Verifier]] = {}
        for vkey in logs:
            v = note.Verifier.parse(vkey)
            self.logs.setdefault(v.name, []).append(v)  # a log's key name is its origin
        self._path = self.dir / STATE_FILE
        self._lock = threading.Lock()  # check-and-persist is atomic (the spec's rollback race)
        self.refused = 0

    def vkey(self) -> str:
        return self.key.vkey()

    def _state(self) -> dict[str, _Record]:
        try:
            state: dict[str, _Record] = json.loads(self._path.read_text())
            return state
        except FileNotFoundError:
            return {}

    def known(self, origin: str) -> tuple[int, bytes] | None:
        rec = self._state().get(origin)
        return None if rec is None else (int(rec["size"]), note.b64decode_strict(rec["root"]))

    def add_checkpoint(self, request: bytes) -> Answer:
        """The add-checkpoint endpoint, transport aside."""
        try:
            text = request.decode("utf-8")
            head, sep, signed = text.partition("\n\n")
            if not sep:
                raise VerificationError("no blank line before the checkpoint")
            lines = head.split("\n")
            m = _OLD.match(lines[0])
            if m is None:
                raise VerificationError("first line must be 'old <size>'")
            old = int(m.group(1))
            if len(lines) - 1 > MAX_PROOF_LINES:
                raise VerificationError("more than 63 consistency proof lines")
            proof = [note.b64decode_strict(ln) for ln in lines[1:]]
            body_text, _ = note.split(signed)
            origin = body_text.split("\n", 1)[0]
        except (UnicodeDecodeError, VerificationError) as exc:
            return _text(400, f"malformed add-checkpoint request: {exc}")
        verifiers = self.logs.get(origin)
        if not verifiers:
            return _text(404, f"unknown log origin {origin!r}")
        try:
            note.open_note(signed, *verifiers)
        except VerificationError as exc:
            return self._refuse(403, origin, f"checkpoint signature: {exc}")
        try:
            cp = parse_body(body_text)
        except VerificationError as exc:
            return _text(400, f"malformed checkpoint: {exc}")
        if old > cp.size:
            return _text(400, f"old size {old} is larger than the checkpoint size {cp.size}")
        if cp.size == 0 and cp.root != merkle.EMPTY_ROOT:
            return self._refuse(422, origin, "a checkpoint of size 0 must have the empty tree's root")
        with self._lock, locked(self._path):
            state = self._state()
            rec = state.get(origin)
            known = 0 if rec is None else int(rec["size"])
            if old != known:
                return Answer(409, f"{known}\n".encode(), SIZE_TYPE)
            try:
                if old == 0 or rec is None:  # rec is None only when old == known == 0
                    if proof:
                        raise merkle.ProofError("the consistency proof from size 0 must be empty")
                else:
                    merkle.verify_consistency(old, cp.size, note.b64decode_strict(rec["root"]), cp.root, proof)
            except merkle.ProofError as exc:
                return self._refuse(422, origin, f"not consistent with size {known}: {exc}")
            line = cosign(self.key, body_text, max(1, int(time.time())))
            state[origin] = {"size": cp.size, "root": note.b64(cp.root), "checkpoint": signed + line}
            atomic_write(self._path, (json.dumps(state, sort_keys=True, indent=1) + "\n").encode())
        return Answer(200, line.encode())

    def _refuse(self, status: int, origin: str, msg: str) -> Answer:
        self.refused += 1  # a validly signed but inconsistent checkpoint is evidence: say so
        print(f"fak witness: refused a checkpoint of {origin} ({status}): {msg}", file=sys.stderr, flush=True)
        return _text(status, msg)

    def checkpoint(self, origin_hash: str) -> Answer:
        for origin, rec in self._state().items():
            if hashlib.sha256(origin.encode()).hexdigest() == origin_hash:
                return Answer(200, rec["checkpoint"].encode())
        return _text(404, "no checkpoint cosigned for that origin")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the spec asks
    server: _Server

    def _answer(self, a: Answer) -> None:
        self.send_response(a.status)
        self.send_header("Content-Type", a.content_type)
        self.send_header("Content-Length", str(len(a.body)))
        self.end_headers()
        self.wfile.write(a.body)

    def do_POST(self) -> None:  # noqa: N802
        prefix = self.server.prefix
        if self.path != prefix + "/add-checkpoint":
            return self._answer(_text(404, "not found"))
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            return self._answer(_text(411, "Content-Length required"))
        if not 0 <= n <= MAX_BODY:
            self.close_connection = True
            return self._answer(_text(413, "request too large"))
        self._answer(self.server.witness.add_checkpoint(self.rfile.read(n)))

    def do_GET(self) -> None:  # noqa: N802
        prefix, path = self.server.prefix, self.path
        m = re.fullmatch(re.escape(prefix) + r"/([0-9a-f]{64})/checkpoint", path)
        self._answer(self.server.witness.checkpoint(m.group(1)) if m else _text(404, "not found"))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # refusals are reported by the witness itself


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    witness: Witness
    prefix: str


class WitnessServer:
    """A witness listening on ``host:port`` (loopback by default) in a background thread."""

    def __init__(self, witness: Witness, host: str = "127.0.0.1", port: int = 0, prefix: str = "") -> None:
        self.witness = witness
        self._httpd = _Server((host, port), _Handler)
        self._httpd.witness, self._httpd.prefix = witness, prefix.rstrip("/")
        h, p = self._httpd.server_address[:2]
        h = h.decode() if isinstance(h, bytes) else h
        self.url = f"http://{h}:{p}{self._httpd.prefix}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fak-witness", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> WitnessServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ the log's client


@dataclass(frozen=True)
class WitnessEndpoint:
    """A witness the log asks to cosign: its submission prefix URL and its cosignature vkey."""

    url: str
    vkey: str

    @classmethod
    def parse(cls, value: str | WitnessEndpoint) -> WitnessEndpoint:
        """``"<url> <vkey>"`` (as in settings) or an endpoint."""
        if isinstance(value, WitnessEndpoint):
            return value
        parts = str(value).split()
        if len(parts) != 2:
            raise AuditError(f"a witness is '<url> <vkey>', not {value!r}")
        url, vkey = (parts[1], parts[0]) if "://" in parts[1] else (parts[0], parts[1])
        from fak.audit.cosignature import parse_witness_vkey

        parse_witness_vkey(vkey)
        if urlsplit(url).scheme not in ("http", "https"):
            raise AuditError(f"witness URL {url!r} must be http(s)")
        return cls(url.rstrip("/"), vkey)


class WitnessConflict(AuditError):
    """409: the witness's last cosigned size is not the old size sent."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the witness knows size {size}")
        self.size = size


class WitnessRefused(AuditError):
    """Any other non-200 answer."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"witness answered {status}: {body.strip()[:200]}")
        self.status = status


class WitnessClient:
    """One keep-alive HTTP connection to a witness (used by one thread at a time)."""

    def __init__(self, endpoint: WitnessEndpoint, timeout: float = 5.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        u = urlsplit(endpoint.url)
        self._https, self._host, self._port, self._path = u.scheme == "https", u.hostname or "", u.port, u.path
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def add_checkpoint(self, old_size: int, proof: list[bytes], signed_note: str) -> list[str]:
        """POST add-checkpoint; the cosignature lines by this witness's key, verified.
        Raises WitnessConflict (409, with the witness's size) or WitnessRefused."""
        body = (f"old {old_size}\n" + "".join(note.b64(h) + "\n" for h in proof) + "\n" + signed_note).encode()
        for attempt in (0, 1):  # a keep-alive connection the server closed: reconnect once
            conn = self._connection()
            try:
                conn.request("POST", self._path + "/add-checkpoint", body=body,
                             headers={"Content-Type": "text/plain; charset=utf-8"})
                resp = conn.getresponse()
                data = resp.read().decode("utf-8", "replace")
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
            except Exception:
                self.close()
                raise
        if resp.status == 409 and resp.getheader("Content-Type", "").startswith(SIZE_TYPE):
            try:
                raise WitnessConflict(int(data.strip()))
            except ValueError:
                raise WitnessRefused(409, data) from None
        if resp.status != 200:
            raise WitnessRefused(resp.status, data)
        text, _ = split_note(signed_note)
        lines = [ln + "\n" for ln in data.split("\n") if ln]
        good = []
        for ln in lines:
            if matches(self.endpoint.vkey, ln):
                verify_cosignature(self.endpoint.vkey, text, ln)
                good.append(ln)
        if not good:
            raise WitnessRefused(200, "no cosignature by the configured witness key in the answer")
        return good
