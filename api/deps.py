"""Authentication and role checks as FastAPI dependencies. Every failure is audited (keyed
fingerprints of the key and client, never the key): the first of each reason in a window as an
``AuthFailure`` event, the rest counted into one ``AuthFailures`` event (api/authlog.py)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Depends, Request

from fak.api.keys import Principal, Role
from fak.api.problems import Unauthorized
from fak.errors import Forbidden
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller, Right


def kernel(request: Request) -> Kernel:
    k: Kernel = request.app.state.kernel
    return k


def _presented(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def _log_failure(request: Request, reason: str, fingerprint: str | None, tenant: str = "") -> None:
    """Counted per window (api/authlog.py): the first of each reason logged, the rest summed,
    so a flood of bogus keys cannot grow the log an entry a request. Never waits on the log."""
    route = request.scope.get("route")
    name = getattr(route, "name", None) or "unknown"
    request.app.state.auth_failures.record(
        reason, tenant=tenant, route=name[:128], key_fingerprint=fingerprint,
        presented=_presented(request) if tenant == "" else None,
        client=request.client.host if request.client is not None else None)


def principal(request: Request) -> Principal:
    check = request.app.state.keys.check(_presented(request))
    if check.principal is None:
        _log_failure(request, check.reason or "unknown_key", check.fingerprint)
        raise Unauthorized("a valid API key is required (Authorization: Bearer fak_...)")
    who: Principal = check.principal
    request.state.principal = who
    return who


def require(*roles: Role) -> Callable[..., Principal]:
    """A dependency that lets only ``roles`` through (403 otherwise, logged)."""
    allowed = set(roles)

    def dep(request: Request, who: Principal = Depends(principal)) -> Principal:  # noqa: B008
        if who.role not in allowed:
            _log_failure(request, "forbidden", None, who.tenant)
            raise Forbidden(f"role {who.role.value} may not do this (needs {', '.join(sorted(allowed))})")
        return who

    return dep


AGENT = require(Role.AGENT, Role.ADMIN)
READER = require(Role.AGENT, Role.AUDITOR, Role.APPROVER, Role.ADMIN)
APPROVER = require(Role.APPROVER, Role.ADMIN)  # a person's decision on a held call (never an agent key)
AUDITOR = require(Role.AUDITOR, Role.ADMIN)
ADMIN = require(Role.ADMIN)


def caller(who: Principal) -> Caller:
    """The core's ``Caller`` for a key: its tenant, ``key:<id>`` in the audit log, and the rights
    of its role (checked again by each operation, after the logged role check above)."""
    return Caller(who.tenant, f"key:{who.key_id}", ROLE_RIGHTS[who.role])


ROLE_RIGHTS: dict[Role, frozenset[Right]] = {
    Role.AGENT: frozenset({Right.READ, Right.AGENT}),
    Role.AUDITOR: frozenset({Right.READ, Right.AUDIT}),
    Role.APPROVER: frozenset({Right.READ, Right.APPROVE}),
    Role.ADMIN: frozenset(Right),
}
