"""The API world of the route and isolation tests: two tenants with a key per role, acme's session
with a clean, a quarantined and a forgotten tool result (``World``), the response checks they
share, and conftest's settings with a writable copy of the default policy. Each test module
declares its own ``settings`` and ``world`` fixtures from these (no fixture is imported by name)."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import httpx

from fak.kernel.facade import default_policy_path
from support.kernel_facade_helpers import CLEAN, LOUNGE, POISON

ROLES = ("agent", "auditor", "admin", "approver")


def writable_policy(settings, tmp_path: Path):  # noqa: ANN001, ANN201
    """``settings`` with a writable copy of the default policy (PUT /v1/policy writes it; the
    packaged file is never the target), acme the operator tenant."""

    path = tmp_path / "policy.yaml"
    path.write_bytes(default_policy_path().read_bytes())
    return settings.model_copy(update={"policy_path": path, "operator_tenant": "acme"})


def random_digest() -> str:
    return "blake3k:" + secrets.token_hex(32)


def ok(r: httpx.Response, status: int = 200) -> dict:
    assert r.status_code == status, (r.request.method, r.request.url, r.status_code, r.text[:800])
    return r.json()


class World:
    """Two tenants with a key per role; acme has a session with a clean, a quarantined and
    a forgettable tool result, and one completed forget."""

    def __init__(self, live) -> None:  # noqa: ANN001
        self.live = live
        self.keys = {(t, r): live.key(t, r) for t in ("acme", "evil") for r in ROLES}
        self.c = {tr: live.client(k) for tr, k in self.keys.items()}
        agent = self.c["acme", "agent"]
        self.sid = ok(agent.post("/v1/sessions", json={}), 201)["id"]
        ok(agent.post(f"/v1/sessions/{self.sid}/messages", json={"role": "system", "content": "You are terse."}), 201)
        ok(agent.post(f"/v1/sessions/{self.sid}/messages", json={"role": "user", "content": "Flight?"}), 201)
        admit = ok(agent.post(f"/v1/sessions/{self.sid}/tool-results",
                              json={"tool": "flight_status", "content": CLEAN.decode()}), 201)
        self.ref, self.ref_index, self.ref_segment = admit["ref"], admit["audit_index"], admit["segment"]["id"]
        bad = ok(agent.post(f"/v1/sessions/{self.sid}/tool-results",
                            json={"tool": "web_search", "content": POISON.decode()}), 201)
        assert bad["verdict"] == "QUARANTINE" and not bad["admitted"]
        self.poison_ref = bad["ref"]
        gone = ok(agent.post(f"/v1/sessions/{self.sid}/tool-results",
                             json={"tool": "lounge", "content": LOUNGE.decode()}), 201)
        self.gone_ref = gone["ref"]
        first = ok(self.c["acme", "admin"].post("/v1/forget", json={"ref": self.gone_ref, "reason": "gdpr"}))
        assert first["replay_event"] is None  # answered before the independent replay is logged
        self.request_id = first["request_id"]
        assert live.kernel.replays.wait(self.request_id, timeout=120)
        self.receipt = ok(self.c["acme", "admin"].post("/v1/forget", json={"ref": self.gone_ref}))  # completed
        assert self.receipt["request_id"] == self.request_id and self.receipt["replay_event"]

    def __call__(self, tenant: str, role: str) -> httpx.Client:
        return self.c[tenant, role]

    def close(self) -> None:
        for c in self.c.values():
            c.close()


def _normal(content: bytes, ident: str) -> bytes:
    """``content`` with each whole occurrence of ``ident`` (not inside a longer word) as {ID}."""
    return re.sub(rb"(?<![\w:])" + re.escape(ident.encode()) + rb"(?![\w])", b"{ID}", content)


def same(r1: httpx.Response, id1: str, r2: httpx.Response, id2: str) -> None:
    assert r1.status_code == r2.status_code, (r1.status_code, r2.status_code, r1.text, r2.text)
    assert r1.headers.get("content-type") == r2.headers.get("content-type")
    assert _normal(r1.content, id1) == _normal(r2.content, id2), (r1.text, r2.text)
