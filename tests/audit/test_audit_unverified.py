"""While the log's signer is in alarm (the database's history disagrees with what it signed),
the audit read routes do not present the database's entries and proofs as the log: they
answer 409 ``audit_unverified`` naming the alarm, over a real server, until the operator's
logged reset. Issue 25, item 7 (a)."""

from __future__ import annotations

import httpx
import pytest
from support.audit import rewrite_history

from fak.api.server import serve
from fak.audit import AuditError, AuditLog, PolicyLoaded
from fak.audit.events import canonical

P = "sha256:" + "cd" * 32
UNVERIFIED = "https://fak.dev/problems/audit_unverified"
READS = ("/v1/audit/entries", "/v1/audit/checkpoint", "/v1/audit/proof/consistency?first=1",
         "/v1/audit/export")


def _refused(r: httpx.Response, kind: str) -> dict:
    assert r.status_code == 409, (r.request.url, r.status_code, r.text[:400])
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == UNVERIFIED and body["alarm"] == kind, body
    assert "p-forged" not in r.text  # nothing of the rewritten history is served
    return body


def _check_refused(live, target: int, kind: str) -> dict:  # noqa: ANN001 - a LiveServer
    with live.client(live.key("acme", "auditor")) as aud:
        for path in READS:
            body = _refused(aud.get(path), kind)
        _refused(aud.get(f"/v1/audit/proof/inclusion/{target}"), kind)
        _refused(aud.get(f"/v1/audit/proof/inclusion/{target}", params={"format": "tlog"}), kind)
        # a forget receipt check needs only the pinned key: it still answers
        assert aud.post("/v1/audit/receipts/verify", json={}).json()["ok"] is False
    return body


def test_reads_refused_while_signer_in_alarm(settings, tiny_lm):
    from fak import Kernel

    k = Kernel.open(settings, model=tiny_lm, progress=None)
    url = settings.resolved_database_url
    try:
        with serve(k) as live:
            for i in range(6):
                k.audit.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant="acme"))
            with live.client(live.key("acme", "auditor")) as aud:
                cp = aud.get("/v1/audit/checkpoint").json()  # the signer remembers this tree
                listed = aud.get("/v1/audit/entries", params={"limit": 1000}).json()["entries"]
                target = listed[2]["index"]
                assert aud.get(f"/v1/audit/proof/inclusion/{target}").status_code == 200
            # the attack, with write access to the database alone (triggers dropped, entry
            # edited, tree nodes recomputed, checkpoints deleted), while the server runs
            forged = canonical(PolicyLoaded(policy_id="p-forged", policy_digest=P, tenant="acme"))
            rewrite_history(url, target, forged)
            # the server's next signature (here: asked for by an auditor) compares the stored
            # tree with what the signer remembers, and refuses
            with live.client(live.key("acme", "auditor")) as aud:
                _refused(aud.get("/v1/audit/checkpoint"), "history_rewritten")
            body = _check_refused(live, target, "history_rewritten")
            assert body["remembered_size"] == cp["size"] and "signer-reset" in body["detail"]
            assert k.audit.alarm is not None and k.audit.alarm.kind == "history_rewritten"
        k.close()
        k = Kernel.open(settings, model=tiny_lm, progress=None)  # a restart finds it again
        with serve(k) as live:
            _check_refused(live, target, "history_rewritten")
            # the operator's explicit, logged reset resumes serving
            k.audit.reset_signer(k.audit.size(), principal="ops:alice")
            assert k.audit.alarm is None
            with live.client(live.key("acme", "auditor")) as aud:
                entries = aud.get("/v1/audit/entries", params={"limit": 1000})
                assert entries.status_code == 200 and "p-forged" in entries.text
                assert aud.get("/v1/audit/checkpoint").status_code == 200
                assert aud.get("/v1/audit/export").status_code == 200
    finally:
        k.close()


def test_alarm_stands_for_every_process_with_the_key(tmp_path):
    """The library seam the routes use. An alarm raised by one opener of the log (a CLI on the
    data dir) stands for another that never signed since (the running server): its reads are
    refused (``require_verified``) and it does not sign, until the operator's reset."""
    from fak.audit.errors import AuditUnverified

    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with AuditLog.open(url=url, data_dir=tmp_path) as server:
        for i in range(5):
            server.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant="acme"))
        server.checkpoint()
        assert server.alarm is None
        server.require_verified()
        rewrite_history(url, 1, canonical(PolicyLoaded(policy_id="p-forged", policy_digest=P, tenant="acme")))
        with AuditLog.open(url=url, data_dir=tmp_path) as cli:  # finds it at open
            assert cli.alarm is not None and cli.alarm.kind == "history_rewritten"
            assert server.alarm is not None and server.alarm.kind == "history_rewritten"
            with pytest.raises(AuditUnverified) as err:
                server.require_verified()
            assert err.value.alarm == "history_rewritten" and err.value.status == 409
            assert err.value.code == "audit_unverified" and "signer-reset" in str(err.value)
            with pytest.raises(AuditError, match="rewritten"):
                server.checkpoint()
            cli.reset_signer(cli.size(), principal="ops:alice")
        assert server.alarm is None
        server.require_verified()
        server.append(PolicyLoaded(policy_id="p9", policy_digest=P, tenant="acme"))
        assert server.checkpoint().size == server.size()
