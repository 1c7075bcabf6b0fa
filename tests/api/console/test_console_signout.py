"""Console sign-out and cookies (api/console/auth.py) against real servers: a cookie captured
before a sign-out is refused after it (on the same server, after a restart over the same
SQLite database, and on another replica over the same PostgreSQL database); the cookies are
``__Host-`` prefixed, Secure, HttpOnly, SameSite=Strict, Path=/, without Domain; with
``console_secure_cookies`` off they are plain, Path=/console, Secure over https only."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from support.console import browser, csrf_of, sign_in
from support.pg import pg_scratch, pg_server_url

from fak import Kernel, Settings
from fak.api.console import auth
from fak.api.keys import Principal, Role
from fak.api.server import serve


def attributes(header: str) -> tuple[str, dict[str, str]]:
    """A Set-Cookie header's name and its attributes (lower-case names; flags map to '')."""
    first, *rest = [part.strip() for part in header.split(";")]
    attrs = {}
    for a in rest:
        name, _eq, value = a.partition("=")
        attrs[name.lower()] = value
    return first.split("=", 1)[0], attrs


def presenting(url: str, cookie: str) -> httpx.Client:
    """Someone else's client holding a captured session cookie value (no sign-in of its own)."""
    thief = httpx.Client(base_url=url, trust_env=False, follow_redirects=False)
    thief.cookies.set(auth.COOKIE, cookie, domain="127.0.0.1", path="/")  # not Secure: sent over http
    return thief


def test_console_cookies_are_host_prefixed_secure_httponly_strict(world) -> None:
    live = world["live"]
    form = browser(live).get("/console/login")
    _b, signed = sign_in(live, live.key("acme", "auditor"))
    headers = [form.headers["set-cookie"], *signed.headers.get_list("set-cookie")]
    names = {attributes(h)[0] for h in headers}
    assert names == {auth.COOKIE, auth.LOGIN_COOKIE} and all(n.startswith("__Host-") for n in names)
    for header in headers:  # the session cookie, the sign-in form's, and its deletion after sign-in
        _name, attrs = attributes(header)
        assert "secure" in attrs and "httponly" in attrs and attrs["samesite"].lower() == "strict", header
        assert attrs["path"] == "/" and "domain" not in attrs, header


def test_a_cookie_captured_before_sign_out_is_refused_after_it(world) -> None:
    live = world["live"]
    key = live.key("acme", "admin")
    b, _r = sign_in(live, key)
    other, _r = sign_in(live, key)  # a second session of the same key: not signed out by the first's
    captured = b.cookies[auth.COOKIE]
    token = csrf_of(b, "/console/receipts")
    thief = presenting(live.url, captured)
    assert thief.get("/console/sessions").status_code == 200  # before: the cookie is worth a session
    out = b.post("/console/logout", data={"csrf": token})
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    before = live.kernel.audit.size()
    r = thief.get("/console/sessions")
    assert r.status_code == 401 and 'action="/console/login"' in r.text and world["sid"] not in r.text
    forget = thief.post(f"/console/refs/{world['ref']}/forget", data={"csrf": token, "confirm": "yes"})
    assert forget.status_code == 401
    assert thief.post("/console/logout", data={"csrf": token}).status_code == 401
    assert other.get("/console/sessions").status_code == 200
    live.app.state.auth_failures.flush()  # the refusals are counted into the log as the API's are
    deadline = time.time() + 5
    while live.kernel.audit.size() == before and time.time() < deadline:
        time.sleep(0.05)
    refused = [e.event for e in live.kernel.audit.entries("acme", before, None)]
    assert any(e.type == "auth_failure" and e.reason == "signed_out" for e in refused), refused


@pytest.mark.parametrize("role", sorted(r.value for r in auth.CONSOLE_ROLES))
def test_every_console_role_can_sign_out(world, role: str) -> None:
    """Whoever may sign in may sign out (an approver's sign-out was refused with 403, leaving
    its cookie good until it expired)."""
    live = world["live"]
    b, _r = sign_in(live, live.key("acme", role))
    captured = b.cookies[auth.COOKIE]
    token = csrf_of(b, "/console/tool-calls" if role == "approver" else "/console/receipts")
    out = b.post("/console/logout", data={"csrf": token})
    assert out.status_code == 303 and out.headers["location"] == "/console/login", out.text[:300]
    assert presenting(live.url, captured).get("/console/tool-calls").status_code == 401


def test_a_sign_out_is_kept_until_the_cookie_expires_then_pruned(kernel) -> None:
    """The row lives exactly as long as the cookie would: a later sign-out prunes it."""
    logouts = auth.Logouts(kernel.state)
    who = Principal("0123456789abcdef", "acme", Role.AUDITOR)
    first, second = auth.start(who, now_s=1000), auth.start(who, now_s=2000)
    logouts.record(first, now_s=1001)
    logouts.record(first, now_s=1002)  # twice: one row, no error
    assert logouts.signed_out(first) and not logouts.signed_out(second)
    logouts.record(second, now_s=first.expires_s + 1)  # the first cookie has expired by now: its row goes
    assert not logouts.signed_out(first) and logouts.signed_out(second)


def test_a_sign_out_holds_after_a_restart(settings, tiny_lm) -> None:
    """Recorded in the state database, not in the server's memory: a restarted server over the same
    database refuses the signed-out cookie and honours one that was not signed out."""
    with Kernel.open(settings, model=tiny_lm, progress=None) as k, serve(k) as live:
        key = live.key("acme", "auditor")
        gone, _r = sign_in(live, key)
        kept, _r = sign_in(live, key)
        cookies = {"gone": gone.cookies[auth.COOKIE], "kept": kept.cookies[auth.COOKIE]}
        assert gone.post("/console/logout", data={"csrf": csrf_of(gone, "/console/receipts")}).status_code == 303
    with Kernel.open(settings, model=tiny_lm, progress=None) as k, serve(k) as live:
        assert presenting(live.url, cookies["gone"]).get("/console/sessions").status_code == 401
        assert presenting(live.url, cookies["kept"]).get("/console/sessions").status_code == 200


@pytest.fixture
def replicas(tmp_path, tiny_dir, tiny_lm) -> Iterator[Callable[[str], Kernel]]:
    """Kernels named as replicas of one deployment over one PostgreSQL database and key database
    (as tests/kernel/withdrawal/test_replicas.py opens them): what `fak serve --replicas N` runs."""
    main, keys = f"fak_c_{secrets.token_hex(5)}", f"fak_ck_{secrets.token_hex(5)}"
    opened: list[Kernel] = []
    with pg_scratch(f'CREATE SCHEMA "{main}"', f'DROP SCHEMA "{main}" CASCADE'), \
            pg_scratch(f'CREATE SCHEMA "{keys}"', f'DROP SCHEMA "{keys}" CASCADE'):
        base = pg_server_url()
        urls = {"database_url": f"{base}?options=-csearch_path%3D{main}",
                "cas_key_url": f"{base}?options=-csearch_path%3D{keys}"}

        def open_replica(name: str) -> Kernel:
            s = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, replica=name, **urls)
            k = Kernel.open(s, model=tiny_lm, progress=None)
            opened.append(k)
            return k

        try:
            yield open_replica
        finally:
            for k in opened:
                k.close()


@pytest.mark.postgres
def test_a_sign_out_on_one_replica_holds_on_another(replicas) -> None:
    with serve(replicas("r0")) as a, serve(replicas("r1")) as b:
        signed, _r = sign_in(a, a.key("acme", "auditor"))
        captured = signed.cookies[auth.COOKIE]
        assert presenting(b.url, captured).get("/console/sessions").status_code == 200  # one deployment
        assert signed.post("/console/logout", data={"csrf": csrf_of(signed, "/console/receipts")}).status_code == 303
        assert presenting(b.url, captured).get("/console/sessions").status_code == 401


def test_plain_cookies_where_the_deployment_says_so(settings, tiny_lm) -> None:
    """``console_secure_cookies: false``: a console reached over plain http on another address
    (where a browser refuses Secure cookies) signs in with plain cookies, Path=/console."""
    plain = settings.model_copy(update={"console_secure_cookies": False})
    with Kernel.open(plain, model=tiny_lm, progress=None) as k, serve(k) as live:
        b = httpx.Client(base_url=live.url, trust_env=False, follow_redirects=False)  # a jar that drops Secure
        form = b.get("/console/login")
        token = form.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        r = b.post("/console/login", data={"key": live.key("acme", "auditor"), "csrf": token})
        assert r.status_code == 303
        name, attrs = attributes(next(h for h in r.headers.get_list("set-cookie") if "fak_console=" in h))
        assert name == "fak_console" and attrs["path"] == "/console" and "secure" not in attrs
        assert "httponly" in attrs and attrs["samesite"].lower() == "strict"
        assert b.get("/console/sessions").status_code == 200
