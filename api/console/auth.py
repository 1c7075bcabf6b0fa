"""The console's sign-in: a short-lived, MACed session cookie, a CSRF token per session, and
sign-outs recorded in the state database.

Why a cookie and not the key in page memory: the pages are rendered on the server (no
JavaScript that could add an ``Authorization`` header to every request), and a key held by
page script is readable by any script that runs there. The cookie never carries the key:
only a random session id, the key's id, tenant and role, an expiry and the session's CSRF
token, MACed under a key derived from the master secret (``Kernel.derive_key(LABEL)``). It is
``__Host-`` prefixed (``Secure``, ``Path=/``, no ``Domain``: no other host or path can set or
shadow it), ``HttpOnly``, ``SameSite=Strict``, and lives at most ``LIFETIME_S`` (never past the
key's own expiry). Every request re-reads the key's row, so a revoked or expired key signs its
sessions out at once; a sign-out is written to ``fak_console_logouts`` (``Logouts``) until the
cookie would expire, so a cookie captured before it is refused after it on every replica and
after a restart. docs/console.md says more.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from fastapi import Request
from starlette.responses import Response

from fak.api.keys import KeyStore, Principal, Role
from fak.state.store import StateStore

LABEL = "fak/api/console-session"  # the MAC key of the session cookie
HOST_PREFIX = "__Host-"  # Secure, Path=/, no Domain: the browser refuses it otherwise
COOKIE = HOST_PREFIX + "fak_console"
LOGIN_COOKIE = HOST_PREFIX + "fak_console_login"  # the sign-in form's own CSRF token (double submit)
LIFETIME_S = 15 * 60  # a signed-in session lasts this long, then the key is asked for again
CONSOLE_ROLES = frozenset({Role.AUDITOR, Role.ADMIN, Role.APPROVER})  # an approver: the held calls' pages only
MAC_DOMAIN = b"fak-console-session/v2\0"  # v2: the session id; a v1 cookie (without one) is refused


@dataclass(frozen=True)
class ConsoleSession:
    """A signed-in session: its id (what a sign-out records), who, until when, and the token
    every form of it carries."""

    session_id: str
    key_id: str
    tenant: str
    role: Role
    expires_s: int
    csrf: str

    @property
    def principal(self) -> Principal:
        return Principal(self.key_id, self.tenant, self.role)


class SessionCodec:
    """Seals and opens session cookie values (``<base64url json>.<hex HMAC-SHA256>``)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, payload: bytes) -> str:
        return hmac.new(self._key, MAC_DOMAIN + payload, hashlib.sha256).hexdigest()

    def seal(self, s: ConsoleSession) -> str:
        body = json.dumps({"i": s.session_id, "k": s.key_id, "t": s.tenant, "r": s.role.value, "e": s.expires_s,
                           "c": s.csrf}, separators=(",", ":"), sort_keys=True).encode()
        payload = base64.urlsafe_b64encode(body).rstrip(b"=")
        return payload.decode() + "." + self._mac(payload)

    def open(self, value: str | None, now_s: float | None = None) -> ConsoleSession | None:
        """The session a cookie value holds, or None (absent, forged, malformed, expired)."""
        if not value or len(value) > 1024 or "." not in value:
            return None
        payload_text, mac = value.rsplit(".", 1)
        payload = payload_text.encode("ascii", "replace")
        if not hmac.compare_digest(self._mac(payload), mac):
            return None
        try:
            d = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
            s = ConsoleSession(str(d["i"]), str(d["k"]), str(d["t"]), Role(d["r"]), int(d["e"]), str(d["c"]))
        except (ValueError, KeyError, TypeError):
            return None
        return s if (time.time() if now_s is None else now_s) < s.expires_s else None


def start(principal: Principal, now_s: float | None = None) -> ConsoleSession:
    """A new session for a key that signed in: ``LIFETIME_S``, or less if the key expires first."""
    end = int((time.time() if now_s is None else now_s) + LIFETIME_S)
    if principal.expires_us is not None:
        end = min(end, principal.expires_us // 1_000_000)
    return ConsoleSession(secrets.token_urlsafe(16), principal.key_id, principal.tenant, principal.role, end,
                          secrets.token_urlsafe(24))


def still_valid(keys: KeyStore, s: ConsoleSession) -> str | None:
    """None while the session's key is active with the same tenant and role; else the reason
    (as the API's auth failures name it) the session is over."""
    row = next((r for r in keys.list(s.tenant) if r.key_id == s.key_id), None)
    if row is None or row.role != s.role.value:
        return "unknown_key"
    state = keys.state(row)
    return {"active": None, "revoked": "revoked_key", "expired": "expired"}.get(state, "unknown_key")


class Logouts:
    """The sign-outs of sessions whose cookies have not expired yet, in the state database
    (``fak_console_logouts``, ``StateStore.record_console_logout``), so they hold on every
    replica sharing it and across a restart.

    Written before the sign-out answers: a client that goes away mid-request or a crash after
    the write leaves the session signed out. A row is only a random session id and its expiry
    (no key, no tenant data) and is pruned once the cookie would have expired anyway. Someone
    who can write the database can delete a row, which makes that signed-out cookie valid
    again until its expiry: they also need the cookie itself, which the browser no longer
    holds. Adding rows only signs sessions out."""

    def __init__(self, state: StateStore) -> None:
        self._state = state

    def record(self, s: ConsoleSession, now_s: float | None = None) -> None:
        """Sign ``s`` out until its cookie expires (idempotent); prune sign-outs that expired."""
        now_us = int((time.time() if now_s is None else now_s) * 1_000_000)
        self._state.record_console_logout(s.session_id, s.expires_s * 1_000_000, now_us)

    def signed_out(self, s: ConsoleSession) -> bool:
        """Whether ``s`` was signed out."""
        return self._state.console_signed_out(s.session_id)


def secure_cookies(request: Request) -> bool:
    """The ``console_secure_cookies`` setting of the kernel this app serves (default on)."""
    return bool(request.app.state.kernel.settings.console_secure_cookies)


def cookie_name(request: Request, name: str) -> str:
    """``name`` (``__Host-`` prefixed) with secure cookies, else without the prefix, which a
    browser refuses on a cookie that is not ``Secure``."""
    return name if secure_cookies(request) else name.removeprefix(HOST_PREFIX)


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """``__Host-``, Secure, Path=/, HttpOnly, SameSite=Strict; with ``console_secure_cookies``
    off: no prefix, Path=/console, Secure over https only."""
    secure = secure_cookies(request)
    response.set_cookie(cookie_name(request, name), value, max_age=max_age, path="/" if secure else "/console",
                        httponly=True, samesite="strict", secure=secure or request.url.scheme == "https")


def clear_cookie(response: Response, request: Request, name: str) -> None:
    secure = secure_cookies(request)
    response.delete_cookie(cookie_name(request, name), path="/" if secure else "/console", httponly=True,
                           samesite="strict", secure=secure or request.url.scheme == "https")


def cookie(request: Request, name: str) -> str | None:
    """The value of the console cookie ``name`` in the request, under its configured name."""
    return request.cookies.get(cookie_name(request, name))


def same_token(expected: str | None, presented: str | None) -> bool:
    """Constant-time equality of two CSRF tokens; a missing one never matches."""
    return bool(expected) and bool(presented) and hmac.compare_digest(str(expected), str(presented))
