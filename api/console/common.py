"""What every console page shares: the templates and the security headers, the signed-in
session (its key re-checked on every request, refusals counted into the audit log as the
API's are), the error page, and ``page`` / ``post_page``, which run a page's body for a
session with the rights of its key's role (a form POST also checks its CSRF token)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from fak.api.console import auth
from fak.api.deps import caller
from fak.api.keys import KeyStore, Role
from fak.errors import FakError
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
CSS = (Path(__file__).parent / "templates" / "console.css").read_text()
INCLUSION_JS = (Path(__file__).parent / "static" / "inclusion.js").read_text()
MAX_FORM = 256 << 10  # bytes of one console form (a pasted receipt included)
HEADERS = {
    # scripts and styles only from our own files (one script: the in-browser inclusion check), no
    # inline script or handler, nothing fetched from elsewhere; forms post only here; never framed
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Refused(Exception):
    """A console request refused before any data is read: 401 (no valid session), 403."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def kernel_of(request: Request) -> Kernel:
    k: Kernel = request.app.state.kernel
    return k


def session_codec(request: Request) -> auth.SessionCodec:
    codec: auth.SessionCodec | None = getattr(request.app.state, "console_codec", None)
    if codec is None:
        codec = request.app.state.console_codec = auth.SessionCodec(kernel_of(request).derive_key(auth.LABEL))
    return codec


def logouts(request: Request) -> auth.Logouts:
    """The deployment's console sign-outs (in the state database: every replica sees them)."""
    logouts: auth.Logouts | None = getattr(request.app.state, "console_logouts", None)
    if logouts is None:
        logouts = request.app.state.console_logouts = auth.Logouts(kernel_of(request).state)
    return logouts


def audit_refusal(request: Request, reason: str, *, tenant: str = "", fingerprint: str | None = None,
                   presented: str | None = None) -> None:
    """Counted into the log exactly as the API's refusals are (api/authlog.py)."""
    route = request.scope.get("route")
    name = getattr(route, "name", None) or "console"
    request.app.state.auth_failures.record(
        reason, tenant=tenant, route=name[:128], key_fingerprint=fingerprint, presented=presented,
        client=request.client.host if request.client is not None else None)


def signed_in(request: Request, *roles: Role) -> auth.ConsoleSession:
    """The request's session, its key re-checked now; ``Refused`` (logged) otherwise."""
    value = auth.cookie(request, auth.COOKIE)
    s = session_codec(request).open(value)
    if s is None:
        audit_refusal(request, "missing_key" if not value else "unknown_key")
        raise Refused(401, "sign in with an auditor or admin API key")
    if logouts(request).signed_out(s):
        audit_refusal(request, "signed_out", tenant=s.tenant)
        raise Refused(401, "this session was signed out: sign in again")
    keys: KeyStore = request.app.state.keys
    why = auth.still_valid(keys, s)
    if why is not None:
        audit_refusal(request, why)
        raise Refused(401, "your session ended (the key is no longer valid): sign in again")
    if roles and s.role not in roles:
        audit_refusal(request, "forbidden", tenant=s.tenant)
        raise Refused(403, f"role {s.role.value} may not do this (needs {', '.join(sorted(r.value for r in roles))})")
    return s


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    response = templates.TemplateResponse(request, template, context, status_code=status)
    response.headers.update(HEADERS)
    return response


def error_page(request: Request, status: int, title: str, detail: str, s: auth.ConsoleSession | None) -> HTMLResponse:
    token = None
    if status == 401:
        token = secrets.token_urlsafe(24)
    response = render(request, "error.html", status, title=title, detail=detail, s=s, login_token=token)
    if token is not None:
        auth.set_cookie(response, request, auth.LOGIN_COOKIE, token, 600)
        auth.clear_cookie(response, request, auth.COOKIE)
    return response


def page(request: Request, roles: tuple[Role, ...], body: Callable[[auth.ConsoleSession, Caller, Kernel], Response]
         ) -> Response:
    """Runs a page for a signed-in session: a refusal or a kernel error becomes an error page
    with the status the API would answer (401, 403, 404, 409, 410...)."""
    s: auth.ConsoleSession | None = None
    try:
        s = signed_in(request, *(roles or (Role.AUDITOR, Role.ADMIN)))
        return body(s, caller(s.principal), kernel_of(request))
    except Refused as e:
        return error_page(request, e.status, "Sign in" if e.status == 401 else "Forbidden", e.detail, s)
    except FakError as e:
        status = e.status if 400 <= e.status < 500 else 500
        detail = (str(e).splitlines() or [e.code])[0] if status < 500 else "internal error (logged on the server)"
        return error_page(request, status, e.code.replace("_", " "), detail, s)


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the only kind the console's forms send)."""
    body = await request.body()
    if len(body) > MAX_FORM:
        raise Refused(413, "form too large")
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=16)
    except ValueError:  # more fields than any console form has
        raise Refused(400, "not a console form") from None
    return {k: v[0] for k, v in fields.items()}


def csrf_ok(s: auth.ConsoleSession, form: dict[str, str], request: Request) -> None:
    if not auth.same_token(s.csrf, form.get("csrf")):
        audit_refusal(request, "forbidden", tenant=s.tenant)
        raise Refused(403, "the form's CSRF token is missing or wrong: reload the page and try again")


async def post_page(request: Request, roles: tuple[Role, ...],
                    body: Callable[[auth.ConsoleSession, Caller, Kernel, dict[str, str]], Response]) -> Response:
    """``page`` for a form POST: the session's CSRF token must come back in the form."""
    try:
        form = await read_form(request)
    except Refused as e:
        return error_page(request, e.status, "Refused", e.detail, None)

    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        csrf_ok(s, form, request)
        return body(s, c, k, form)

    return page(request, roles, run)
