"""The console's sign-in: a short-lived, MACed session cookie and a CSRF token per session.

Why a cookie and not the key in page memory: the pages are rendered on the server (no
JavaScript that could add an ``Authorization`` header to every request), and a key held by
page script is readable by any script that runs there. The cookie never carries the key:
only its id, tenant and role, an expiry and the session's CSRF token, MACed under a key
derived from the master secret (``Kernel.derive_key(LABEL)``). It is ``HttpOnly``,
``SameSite=Strict``, ``Secure`` when the request came over https, and lives at most
``LIFETIME_S`` (and never past the key's own expiry). Every request re-reads the key's row, so
a revoked or expired key signs its sessions out at once. docs/console.md says more.
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

LABEL = "fak/api/console-session"  # the MAC key of the session cookie
COOKIE = "fak_console"
LOGIN_COOKIE = "fak_console_login"  # the sign-in form's own CSRF token (double submit)
LIFETIME_S = 15 * 60  # a signed-in session lasts this long, then the key is asked for again
CONSOLE_ROLES = frozenset({Role.AUDITOR, Role.ADMIN})


@dataclass(frozen=True)
class ConsoleSession:
    """A signed-in session: who, until when, and the token every form of it carries."""

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
        return hmac.new(self._key, b"fak-console-session/v1\0" + payload, hashlib.sha256).hexdigest()

    def seal(self, s: ConsoleSession) -> str:
        body = json.dumps({"k": s.key_id, "t": s.tenant, "r": s.role.value, "e": s.expires_s, "c": s.csrf},
                          separators=(",", ":"), sort_keys=True).encode()
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
            s = ConsoleSession(str(d["k"]), str(d["t"]), Role(d["r"]), int(d["e"]), str(d["c"]))
        except (ValueError, KeyError, TypeError):
            return None
        return s if (time.time() if now_s is None else now_s) < s.expires_s else None


def start(principal: Principal, now_s: float | None = None) -> ConsoleSession:
    """A new session for a key that signed in: ``LIFETIME_S``, or less if the key expires first."""
    end = int((time.time() if now_s is None else now_s) + LIFETIME_S)
    if principal.expires_us is not None:
        end = min(end, principal.expires_us // 1_000_000)
    return ConsoleSession(principal.key_id, principal.tenant, principal.role, end, secrets.token_urlsafe(24))


def still_valid(keys: KeyStore, s: ConsoleSession) -> str | None:
    """None while the session's key is active with the same tenant and role; else the reason
    (as the API's auth failures name it) the session is over."""
    row = next((r for r in keys.list(s.tenant) if r.key_id == s.key_id), None)
    if row is None or row.role != s.role.value:
        return "unknown_key"
    state = keys.state(row)
    return {"active": None, "revoked": "revoked_key", "expired": "expired"}.get(state, "unknown_key")


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """HttpOnly, SameSite=Strict, path /console, Secure over https."""
    response.set_cookie(name, value, max_age=max_age, path="/console", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def clear_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(name, path="/console", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")


def same_token(expected: str | None, presented: str | None) -> bool:
    """Constant-time equality of two CSRF tokens; a missing one never matches."""
    return bool(expected) and bool(presented) and hmac.compare_digest(str(expected), str(presented))
