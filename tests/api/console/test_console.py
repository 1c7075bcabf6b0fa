"""The console (/console, api/console/) against a real uvicorn server: sign-in with an auditor
or admin key (an agent key refused), no page without a valid session, CSRF on every POST,
another tenant's session a 404 page, a quarantined tool result marked, an admin forget whose
receipt verifies, and every refusal counted into the audit log as the API's are."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

from fastapi.routing import iter_route_contexts
from support.console import CSRF, browser, csrf_of, hold, sign_in

from fak.api.console import auth
from fak.api.keys import Principal, Role

PAGES = ("/console/sessions", "/console/refs", "/console/audit", "/console/receipts", "/console/tool-calls",
         "/console/metrics")


def test_auditor_signs_in_and_sees_the_quarantined_result(world) -> None:
    live = world["live"]
    b, r = sign_in(live, live.key("acme", "auditor"))
    assert r.status_code == 303 and r.headers["location"] == "/console/sessions"
    cookie = r.headers["set-cookie"]
    assert auth.COOKIE in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "fak_" not in b.cookies[auth.COOKIE]  # never the key
    listed = b.get("/console/sessions")
    assert listed.status_code == 200 and world["sid"] in listed.text
    page = b.get(f"/console/sessions/{world['sid']}")
    assert page.status_code == 200
    row = re.search(rf'<tr class="state-quarantined" id="seg-{re.escape(world["poison_segment"])}">', page.text)
    assert row, page.text[:2000]
    assert '<span class="state quarantined">quarantined</span>' in page.text and "<svg" in page.text
    for path in PAGES:
        assert b.get(path).status_code == 200, path
    audit = b.get("/console/audit", params={"type": "admission_verdict"})
    assert "QUARANTINE" in audit.text and "Latest checkpoint" in audit.text
    assert "admission_verdict</td>" in b.get("/console/audit", params={"since": "2000-01-01T00:00"}).text
    assert "admission_verdict</td>" not in b.get("/console/audit", params={"until": "2000-01-01T00:00"}).text
    keys_only = b.get("/console/audit", params={"type": "key_created"}).text
    assert "<td>key_created</td>" in keys_only and "<td>admission_verdict</td>" not in keys_only
    metrics = b.get("/console/metrics").text
    assert re.search(r"<th>admission QUARANTINE</th><td>1 \(\d+\.\d%\)</td>", metrics), metrics[-1500:]
    ref = b.get(f"/console/refs/{world['ref']}")
    assert ref.status_code == 200 and world["sid"] in ref.text and 'id="forget"' not in ref.text  # not an admin


def test_agent_key_and_bad_keys_cannot_sign_in_and_are_audited(world) -> None:
    live = world["live"]
    before = live.kernel.audit.size()
    _b, r = sign_in(live, live.key("acme", "agent"))
    assert r.status_code == 403 and auth.COOKIE + "=" not in r.headers.get("set-cookie", "").replace(
        auth.LOGIN_COOKIE, "")
    _b, r = sign_in(live, "fak_0123456789abcdef_nope")
    assert r.status_code == 401
    b = browser(live)
    assert b.post("/console/login", data={"key": live.key("acme", "auditor")}).status_code == 403  # no CSRF token
    live.app.state.auth_failures.flush()
    deadline = time.time() + 5
    while live.kernel.audit.size() < before + 2 and time.time() < deadline:
        time.sleep(0.05)
    assert live.kernel.audit.size() >= before + 2  # the first forbidden and unknown_key, logged at once


def test_no_session_no_data(world) -> None:
    live = world["live"]
    b = browser(live)
    for path in (*PAGES, f"/console/sessions/{world['sid']}", f"/console/refs/{world['ref']}"):
        r = b.get(path)
        assert r.status_code == 401, path
        assert world["sid"] not in r.text and world["ref"] not in r.text and 'action="/console/login"' in r.text
    b.cookies.set(auth.COOKIE, "eyJrIjoiMSJ9.deadbeef", path="/console")  # forged
    assert b.get("/console/sessions").status_code == 401
    for path in ("/console/receipts", f"/console/refs/{world['ref']}/forget", "/console/logout"):
        assert b.post(path, data={"csrf": "x"}).status_code == 401


def test_a_revoked_key_signs_its_session_out(world) -> None:
    live = world["live"]
    key = live.key("acme", "auditor")
    b, _r = sign_in(live, key)
    assert b.get("/console/sessions").status_code == 200
    live.app.state.keys.revoke(key.split("_")[1])
    assert b.get("/console/sessions").status_code == 401


def test_a_forged_or_expired_cookie_is_refused() -> None:
    codec = auth.SessionCodec(b"k" * 32)
    s = auth.start(Principal("0123456789abcdef", "acme", Role.AUDITOR), now_s=1000)
    value = codec.seal(s)
    assert codec.open(value, now_s=1001) == s
    assert codec.open(value, now_s=1000 + auth.LIFETIME_S) is None
    assert auth.SessionCodec(b"x" * 32).open(value, now_s=1001) is None
    payload, mac = value.rsplit(".", 1)
    assert codec.open(payload[:-2] + "AA." + mac, now_s=1001) is None
    short = auth.start(Principal("0123456789abcdef", "acme", Role.ADMIN, expires_us=1060 * 10**6), now_s=1000)
    assert short.expires_s == 1060  # never past the key's own expiry


def test_csrf_missing_or_wrong_is_403(world) -> None:
    live = world["live"]
    b, _r = sign_in(live, live.key("acme", "admin"))
    for data in ({}, {"csrf": "wrong"}):
        assert b.post("/console/receipts", data=data | {"receipt": "{}"}).status_code == 403
        r = b.post(f"/console/refs/{world['ref']}/forget", data=data | {"confirm": "yes"})
        assert r.status_code == 403
    assert b.get(f"/console/refs/{world['ref']}").status_code == 200  # not forgotten
    many = "&".join(f"f{i}=x" for i in range(40))
    r = b.post("/console/receipts", content=many, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400


def test_another_tenants_session_is_not_found(world) -> None:
    live = world["live"]
    b, _r = sign_in(live, live.key("acme", "auditor"))
    assert b.get(f"/console/sessions/{world['evil_sid']}").status_code == 404
    assert b.get("/console/sessions/sess_unknown").status_code == 404
    e, _r = sign_in(live, live.key("evil", "admin"))
    assert e.get(f"/console/sessions/{world['sid']}").status_code == 404
    assert e.get(f"/console/refs/{world['ref']}").status_code == 404


def test_admin_forgets_through_the_console_and_sees_a_verified_receipt(world) -> None:
    live = world["live"]
    auditor, _r = sign_in(live, live.key("acme", "auditor"))
    token = csrf_of(auditor, "/console/receipts")
    assert auditor.post(f"/console/refs/{world['ref']}/forget", data={"csrf": token}).status_code == 403
    b, _r = sign_in(live, live.key("acme", "admin"))
    token = csrf_of(b, f"/console/refs/{world['ref']}")
    confirm = b.post(f"/console/refs/{world['ref']}/forget", data={"csrf": token})
    assert confirm.status_code == 200 and 'id="confirm"' in confirm.text and world["sid"] in confirm.text
    assert b.get(f"/console/refs/{world['ref']}").text.count('id="ref-state">live') == 1  # not yet
    done = b.post(f"/console/refs/{world['ref']}/forget", data={"csrf": token, "confirm": "yes"})
    assert done.status_code == 200, done.text[:1000]
    assert 'id="verdict">VERIFIED' in done.text, done.text[:3000]
    assert "segment" in done.text and world["sid"] in done.text
    gone = b.get(f"/console/refs/{world['ref']}")
    assert gone.status_code == 200 and 'id="ref-state">forgotten' in gone.text and "forget_completed" in gone.text
    pasted = re.search(r'<textarea name="receipt"[^>]*>(.*?)</textarea>', done.text, re.S).group(1)
    again = b.post("/console/receipts", data={"csrf": token, "receipt": html.unescape(pasted)})
    assert 'id="verdict">VERIFIED' in again.text
    tampered = html.unescape(pasted).replace('"log_index": ', '"log_index": 1', 1)
    verdict = b.post("/console/receipts", data={"csrf": token, "receipt": tampered}).text
    assert 'id="verdict">NOT VERIFIED' in verdict, re.findall(r"class=.error.>[^<]*|id=.verdict.>[^<]*", verdict)
    request_id = re.search(r"<code>(fgt_[0-9a-f]+)</code>", done.text).group(1)
    deadline = time.time() + 30
    while True:  # the independent replay follows the forget; its receipt then shows it, verified
        later = b.get(f"/console/receipts/{request_id}")
        if "equal</td>" in later.text or time.time() > deadline:
            break
        time.sleep(0.2)
    assert 'id="verdict">VERIFIED' in later.text and "replay: verified" in later.text, re.findall(r"id=.verdict.>[^<]*|<h1[^<]*|class=.error.>[^<]*", later.text)
    assert '<td class="replay">equal</td>' in later.text
    out = b.post("/console/logout", data={"csrf": token})
    assert out.status_code == 303
    assert b.get("/console/sessions").status_code == 401


DOCS_API = Path(__file__).resolve().parents[3] / "docs" / "api.md"


CONSOLE_ROLES = {"none": {"auditor", "admin", "approver"}, "U": {"auditor", "admin"}, "admin": {"admin"},
                 "UP": {"auditor", "admin", "approver"}, "P": {"approver", "admin"}}  # docs/api.md's tokens


def _documented() -> dict[tuple[str, str], str]:
    """docs/api.md's "Console routes" table: (method, path) -> none | U | admin | UP | P."""
    rows = re.findall(r"^\| (GET|POST) \| `(/console[^`]*)` \| (\w+) \|", DOCS_API.read_text(), re.M)
    return {(m, p): role for m, p, role in rows}


def test_console_role_matrix_and_route_table(world) -> None:
    """Every console route is in docs/api.md's table, and answers each role as the table says:
    401 without a session (for every row but none), 403 for a signed-in role the row does not name."""
    live = world["live"]
    routes = {(m, rc.path_format) for rc in iter_route_contexts(live.app.routes)
              if rc.path_format.startswith("/console") for m in rc.methods or ()}
    documented = _documented()
    assert set(documented) == routes, (routes ^ set(documented))
    fill = {"{sid}": world["sid"], "{digest}": world["ref"], "{request_id}": world["request_id"],
            "{call_id}": hold(live, world["sid"], world["poison"]),
            "{index}": str(next(iter(live.kernel.audit.entries("acme", 0, None))).index)}
    anon = browser(live)
    signed = {role: sign_in(live, live.key("acme", role))[0] for role in ("auditor", "admin", "approver")}
    tokens = {role: csrf_of(b, "/console/tool-calls") for role, b in signed.items()}  # a page every role reaches
    for (method, path), role in sorted(documented.items()):
        if path in ("/console/logout", "/console/login"):
            continue  # signs out / in: test_no_session_no_data, the sign-in tests
        url = path
        for name, value in fill.items():
            url = url.replace(name, value)
        data = {"receipt": "{}", "decision": "reject"} if method == "POST" else None
        r = anon.request(method, url, data=data)
        assert (r.status_code == 401) == (role != "none"), (method, path, r.status_code)
        for who, b in signed.items():
            r = b.request(method, url, data=(data or {}) | {"csrf": tokens[who]} if method == "POST" else None)
            if who not in CONSOLE_ROLES[role]:
                assert r.status_code == 403, (method, path, who)
            else:
                assert r.status_code < 400, (method, path, who, r.status_code, r.text[:300])


def test_held_calls_approved_or_rejected_by_admins_only_and_audited(world) -> None:
    live = world["live"]
    call_id = hold(live, world["sid"], world["poison"])
    auditor, _r = sign_in(live, live.key("acme", "auditor"))
    page = auditor.get(f"/console/tool-calls/held/{call_id}")
    assert page.status_code == 200 and "confirm_payments" in page.text and world["poison"] in page.text
    assert 'amount' not in page.text and 'id="approve"' not in page.text  # arguments: admins only
    token = csrf_of(auditor, "/console/receipts")
    assert auditor.post(f"/console/tool-calls/held/{call_id}", data={"csrf": token, "decision": "approve"}
                        ).status_code == 403
    evil, _r = sign_in(live, live.key("evil", "admin"))
    assert evil.get(f"/console/tool-calls/held/{call_id}").status_code == 404
    admin, _r = sign_in(live, live.key("acme", "admin"))
    page = admin.get(f"/console/tool-calls/held/{call_id}")
    assert '"amount": 5' in html.unescape(page.text) and 'id="approve"' in page.text
    token = CSRF.search(page.text).group(1)
    assert admin.post(f"/console/tool-calls/held/{call_id}", data={"decision": "approve"}).status_code == 403
    done = admin.post(f"/console/tool-calls/held/{call_id}", data={"csrf": token, "decision": "approve"})
    assert done.status_code == 200 and 'id="held-state">approved' in done.text, done.text[:2000]
    approvals = [e for e in live.kernel.audit.entries("acme", 0, None) if e.event.type == "tool_call_approval"]
    assert approvals and approvals[-1].event.call_id == call_id and approvals[-1].event.approved
    listed = admin.get("/console/tool-calls")
    assert "approved " + call_id in listed.text
    assert admin.post(f"/console/tool-calls/held/{call_id}", data={"csrf": token, "decision": "reject"}
                      ).status_code == 409  # decided once, as the API answers


def test_the_signer_alarm_is_shown_loudly_and_no_entries(world) -> None:
    """A history rewritten under the server (tests/audit/test_audit_signer.py's attack): the audit
    page answers 409 with the alarm in a banner and no entries, as the API answers 409."""
    from support.audit import rewrite_history

    from fak.audit import PolicyLoaded
    from fak.audit.events import canonical

    live = world["live"]
    b, _r = sign_in(live, live.key("acme", "auditor"))
    assert b.get("/console/audit").status_code == 200  # the signer remembers this tree
    target = next(e.index for e in live.kernel.audit.entries("acme", 0, None) if e.event.type == "admission_verdict")
    forged = canonical(PolicyLoaded(policy_id="p-forged", policy_digest="sha256:" + "0" * 64, tenant="acme"))
    rewrite_history(live.kernel.settings.resolved_database_url, target, forged)
    r = b.get("/console/audit")
    assert r.status_code == 409 and 'id="alarm">SIGNER ALARM (history_rewritten)' in r.text, r.text[-1500:]
    assert "p-forged" not in r.text and "<table class=\"entries\">" not in r.text
    assert b.get(f"/console/refs/{world['ref']}").status_code == 409  # its history is not shown either


def test_an_entry_page_carries_a_proof_the_server_and_anyone_can_check(world) -> None:
    """/console/audit/entries/{index}: the entry's exact bytes, its proof and the checkpoint the
    page's script checks (here re-checked with fak's own verifier from the page's data alone);
    the script comes from this origin only (CSP) and another tenant's index is a 404 page."""
    import json as json_

    from fak.audit import note, verify_tlog_proof  # noqa: F401 - the proof's own verifiers
    from fak.audit.checkpoint import open_checkpoint
    from fak.audit.merkle import hash_leaf, verify_inclusion

    live = world["live"]
    index = next(e.index for e in live.kernel.audit.entries("acme", 0, None) if e.event.type == "admission_verdict")
    b, _r = sign_in(live, live.key("acme", "auditor"))
    audit = b.get("/console/audit").text
    assert f'href="/console/audit/entries/{index}"' in audit
    page = b.get(f"/console/audit/entries/{index}")
    assert page.status_code == 200 and 'id="server-check" class="note"' in page.text, page.text[-2000:]
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert "'unsafe-inline'" not in page.headers["Content-Security-Policy"]
    assert '<script src="/console/inclusion.js"></script>' in page.text
    data = json_.loads(html.unescape(re.search(
        r'<script type="application/json" id="inclusion-data">(.*?)</script>', page.text, re.S).group(1)))
    proof, body = data["proof"], data["entry"].encode()
    assert body == live.kernel.audit.entry(index).body and data["leaf_hash"] == hash_leaf(body).hex()
    cp = open_checkpoint(proof["checkpoint"], note.Verifier.parse(live.kernel.audit.public_key()))
    verify_inclusion(index, proof["treeSize"], hash_leaf(body), [bytes.fromhex(h) for h in proof["hashes"]], cp.root)
    script = b.get("/console/inclusion.js")
    assert script.status_code == 200 and "rootFromInclusion" in script.text
    evil, _r = sign_in(live, live.key("evil", "auditor"))
    assert evil.get(f"/console/audit/entries/{index}").status_code == 404
    assert browser(live).get(f"/console/audit/entries/{index}").status_code == 401


def test_the_audit_filters_by_ref_and_session_and_the_tool_calls_queue(world) -> None:
    live = world["live"]
    b, _r = sign_in(live, live.key("acme", "auditor"))
    by_ref = b.get("/console/audit", params={"ref": world["poison"]}).text
    rows = re.findall(r'<tr class="type-(\w+)">', by_ref)
    assert rows and "admission_verdict" in rows and all(world["poison"] in html.unescape(x) for x in
                                                         re.findall(r'<code class="event">(.*?)</code>', by_ref))
    by_session = b.get("/console/audit", params={"session": world["sid"], "type": "admission_verdict"}).text
    assert len(re.findall(r'<tr class="type-admission_verdict">', by_session)) == 3  # clean, poison, lounge
    assert b.get("/console/tool-calls").text.count('id="pending-none"') == 1
    call_id = hold(live, world["sid"], world["poison"])
    queue = b.get("/console/tool-calls").text
    assert 'id="pending"' in queue and f'href="/console/tool-calls/held/{call_id}"' in queue
    assert "confirm_payments" in queue and world["poison"][:20] in queue
    live.kernel.services.holds.decide("acme", call_id, "rejected", "test", lambda call: 0)
    assert call_id not in b.get("/console/tool-calls").text.split("Decisions and approvals")[0]


def test_the_session_page_says_which_rows_are_exact(world) -> None:
    live = world["live"]
    agent = live.client(live.key("acme", "agent"))
    out = agent.get(f"/v1/sessions/{world['sid']}").json()
    assert out["exact_rows"] == out["tokens"] > 0  # no PIC, no REROPE: every row bit-exact
    agent.close()
    b, _r = sign_in(live, live.key("acme", "auditor"))
    page = b.get(f"/console/sessions/{world['sid']}").text
    assert f"({out['tokens']} bit-exact)" in page
    live_rows = [s for s in out["segments"] if s["start"] is not None]
    assert page.count('<td class="exactness">bit-exact</td>') == len(live_rows) > 0
    assert "approximate</span></td>" not in page


def test_metrics_over_time_are_drawn_from_the_samples(world) -> None:
    """The metrics page charts the tenant's rates between samples (api/console/history.py):
    an admission between two samples is a point on the verdicts chart; no data is said so."""
    from fak.api.console.history import MetricsHistory, tenant_totals

    live = world["live"]
    started = live.app.state.metrics_history
    # a history of the test's own (the server's samples every 10 s would interleave with these)
    history = live.app.state.metrics_history = MetricsHistory(
        lambda: tenant_totals(live.app.state.metrics.registry, live.kernel))
    t0 = time.time()
    history.sample(now=t0 - 20)
    agent = live.client(live.key("acme", "agent"))
    agent.post(f"/v1/sessions/{world['sid']}/tool-results", json={"tool": "flight_status", "content": "on time"})
    agent.close()
    history.sample(now=t0 - 10)
    b, _r = sign_in(live, live.key("acme", "auditor"))
    page = b.get("/console/metrics").text
    m = re.search(r'aria-label="admission verdicts: last ([\d.]+) per min, top ([\d.]+)"', page)
    assert m and float(m.group(2)) >= 6.0, page[-3000:]  # one verdict in 10 s: 6 per minute
    assert "<polyline" in page or "<circle" in page
    assert 'aria-label="forget latency (mean): no data"' in page  # no forget between these samples
    evil, _r = sign_in(live, live.key("evil", "auditor"))
    assert re.search(r'aria-label="admission verdicts: last 0.0 per min, top 0.0"', evil.get("/console/metrics").text)
    live.app.state.metrics_history = started
