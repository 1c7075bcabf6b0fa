"""The console's sign-in pages: the form, sign-in with an auditor, admin or approver key
(refusals logged as the API's), sign-out, and the two static files every page uses (no data).
The cookie, its MAC and the sign-outs are ``fak.api.console.auth``."""

from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from fak.api.console import auth
from fak.api.console.common import (
    CSS,
    HEADERS,
    INCLUSION_JS,
    Refused,
    audit_refusal,
    error_page,
    logouts,
    post_page,
    read_form,
    render,
    session_codec,
)
from fak.api.keys import KeyStore, Role
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/console.css")
def stylesheet() -> Response:
    """The console's only stylesheet (no data)."""
    return Response(CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@router.get("/inclusion.js")
def inclusion_script() -> Response:
    """The in-browser inclusion check of an audit entry's page (no data)."""
    return Response(INCLUSION_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"})


@router.get("")
def home(request: Request) -> Response:
    """To the sessions page (which asks to sign in when there is no session)."""
    return RedirectResponse("/console/sessions", status_code=303, headers=HEADERS)


@router.get("/login")
def login_form(request: Request) -> Response:
    """The sign-in form (no data): its CSRF token travels in a cookie and the form (double submit)."""
    return _login_page(request, 200, None)


def _login_page(request: Request, status: int, detail: str | None) -> HTMLResponse:
    token = secrets.token_urlsafe(24)
    response = render(request, "login.html", status, login_token=token, detail=detail, s=None)
    auth.set_cookie(response, request, auth.LOGIN_COOKIE, token, 600)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    """Sign in with an auditor or admin key: 401 for a key the API would refuse, 403 for an
    agent key; both logged as the API logs them. The key is never stored, only its id."""
    try:
        form = await read_form(request)
    except Refused as e:
        return error_page(request, e.status, "Refused", e.detail, None)
    if not auth.same_token(auth.cookie(request, auth.LOGIN_COOKIE), form.get("csrf")):
        audit_refusal(request, "forbidden")
        return error_page(request, 403, "Forbidden", "the sign-in form's CSRF token is missing or wrong: reload it", None)
    keys: KeyStore = request.app.state.keys
    key = form.get("key", "").strip() or None
    check = keys.check(key)
    if check.principal is None:
        audit_refusal(request, check.reason or "unknown_key", fingerprint=check.fingerprint, presented=key)
        return _login_page(request, 401, "that key is not valid (unknown, revoked or expired)")
    who = check.principal
    if who.role not in auth.CONSOLE_ROLES:
        audit_refusal(request, "forbidden", tenant=who.tenant)
        return error_page(request, 403, "Forbidden",
                      f"role {who.role.value} may not sign in to the console (needs admin, auditor, approver)", None)
    s = auth.start(who)
    # a person who decides held calls lands on their queue; the other pages are the auditors'
    landing = "/console/tool-calls" if who.role is Role.APPROVER else "/console/sessions"
    response = RedirectResponse(landing, status_code=303, headers=HEADERS)
    auth.set_cookie(response, request, auth.COOKIE, session_codec(request).seal(s), max(1, s.expires_s - int(time.time())))
    auth.clear_cookie(response, request, auth.LOGIN_COOKIE)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: the session is recorded as signed out (``auth.Logouts``) before the answer, so
    its cookie is refused from now on wherever it is presented, not only cleared here."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        logouts(request).record(s)
        response = RedirectResponse("/console/login", status_code=303, headers=HEADERS)
        auth.clear_cookie(response, request, auth.COOKIE)
        return response

    return await post_page(request, tuple(auth.CONSOLE_ROLES), run)  # whoever may sign in may sign out
