"""The console as a browser sees it: a cookie-keeping client, sign-in, CSRF tokens, a held call,
and the ``world`` fixture (a tenant's session with a clean, a quarantined and a forgotten tool
result, and another tenant's session). A plugin of tests/conftest.py (``pytest_plugins``): tests
take ``world`` as an argument and import the plain helpers from here."""

from __future__ import annotations

import re
import secrets
import time

import httpx
import pytest

from fak.kernel.calls.held import HeldCall
from support.kernel_facade_helpers import CLEAN, POISON

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def browser(live) -> httpx.Client:  # noqa: ANN001
    """A client that keeps cookies, as a browser does (no Authorization header); like a browser
    it sends ``Secure`` cookies over http to 127.0.0.1 (a secure context), which Python's
    cookie jar does only over https: each kept cookie is marked sendable once it is kept."""
    assert httpx.URL(live.url).host == "127.0.0.1"
    b = httpx.Client(base_url=live.url, trust_env=False, follow_redirects=False)

    def loopback_is_secure(_response: httpx.Response) -> None:
        for kept in b.cookies.jar:
            kept.secure = False

    b.event_hooks["response"].append(loopback_is_secure)
    return b


def sign_in(live, key: str) -> tuple[httpx.Client, httpx.Response]:  # noqa: ANN001
    b = browser(live)
    form = b.get("/console/login")
    assert form.status_code == 200 and "Content-Security-Policy" in form.headers
    token = CSRF.search(form.text).group(1)
    return b, b.post("/console/login", data={"key": key, "csrf": token})


def csrf_of(b: httpx.Client, path: str) -> str:
    return CSRF.search(b.get(path).text).group(1)


def hold(live, sid: str, ref: str) -> str:  # noqa: ANN001
    """A held call in acme's session ``sid``, as the chat door holds a CONFIRM (kernel/openai/chat.py)."""
    call_id = "call_held_" + secrets.token_hex(8)
    live.kernel.services.holds.hold(HeldCall(tenant="acme", session_id=sid, call_id=call_id, tool="pay",
                                             arguments={"amount": 5}, rule_id="confirm_payments",
                                             offending=(ref,), decision_index=None, created=time.time()))
    return call_id


@pytest.fixture
def world(live_server):  # noqa: ANN001
    live = live_server
    live.app.state.metrics_history.sample()  # the baseline `fak serve` takes at start (this server runs no lifespan)
    agent = live.client(live.key("acme", "agent"))
    sid = agent.post("/v1/sessions", json={}).json()["id"]
    agent.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "Flight?"})
    clean = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "flight_status", "content": CLEAN.decode()})
    bad = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "web_search", "content": POISON.decode()})
    assert bad.json()["verdict"] == "QUARANTINE"
    gone = agent.post(f"/v1/sessions/{sid}/tool-results", json={"tool": "lounge", "content": "lounge 3B"}).json()
    admin = live.client(live.key("acme", "admin"))
    request_id = admin.post("/v1/forget", json={"ref": gone["ref"]}).json()["request_id"]
    admin.close()
    evil = live.client(live.key("evil", "agent"))
    evil_sid = evil.post("/v1/sessions", json={}).json()["id"]
    yield {"live": live, "sid": sid, "ref": clean.json()["ref"], "poison": bad.json()["ref"],
           "poison_segment": bad.json()["segment"]["id"], "evil_sid": evil_sid,
           "request_id": request_id}
    agent.close()
    evil.close()
