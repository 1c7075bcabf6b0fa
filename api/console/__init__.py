"""The console at ``/console``: server-rendered pages for auditors and admins (docs/console.md).

Thin routes over ``fak.kernel.operations``, as the JSON API's are: the same ``Caller`` with the
rights of the signed-in key's role, so a page shows exactly what the API would answer that key
(another tenant's session id is a 404 page, an auditor's forget a 403 page). Sign-in, the
session cookie and CSRF are ``fak.api.console.auth``; every refusal is counted into the audit
log as the API's are (``AuthFailureWindow``)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from fak import wire as w
from fak.api.console import auth
from fak.api.console.graph import provenance_svg
from fak.api.console.history import MetricsHistory, Sample, series, sparkline, tenant_totals
from fak.api.deps import caller
from fak.api.keys import KeyStore, Role
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, AuditUnverified
from fak.audit.events import EVENT_TYPES
from fak.audit.merkle import hash_leaf
from fak.audit.note import Verifier
from fak.audit.proofs import InclusionProof
from fak.audit.receipt import verify_receipt
from fak.audit.verify import checkpoint_time
from fak.errors import FakError, InvalidInput, NotFound
from fak.kernel import operations as ops
from fak.kernel.calls.held import same_principal
from fak.kernel.facade import Kernel
from fak.kernel.openai import chat
from fak.kernel.operations import MAX_LIMIT, Caller
from fak.wire import ForgetIn

__all__ = ["router"]

router = APIRouter(prefix="/console", include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
CSS = (Path(__file__).parent / "templates" / "console.css").read_text()
INCLUSION_JS = (Path(__file__).parent / "static" / "inclusion.js").read_text()
MAX_FORM = 256 << 10  # bytes of one console form (a pasted receipt included)
SCAN = 20_000  # audit entries a page with a time filter reads at most
SHOWN = 200  # audit entries one page shows at most
HELD_ROLES = (Role.AUDITOR, Role.ADMIN, Role.APPROVER)  # who sees held calls (approvers and admins decide them)
TYPES = sorted(t.model_fields["type"].default for t in EVENT_TYPES)  # the audit page's type filter
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


def _kernel(request: Request) -> Kernel:
    k: Kernel = request.app.state.kernel
    return k


def _codec(request: Request) -> auth.SessionCodec:
    codec: auth.SessionCodec | None = getattr(request.app.state, "console_codec", None)
    if codec is None:
        codec = request.app.state.console_codec = auth.SessionCodec(_kernel(request).derive_key(auth.LABEL))
    return codec


def _logouts(request: Request) -> auth.Logouts:
    """The deployment's console sign-outs (in the state database: every replica sees them)."""
    logouts: auth.Logouts | None = getattr(request.app.state, "console_logouts", None)
    if logouts is None:
        logouts = request.app.state.console_logouts = auth.Logouts(_kernel(request).state)
    return logouts


def _audit_refusal(request: Request, reason: str, *, tenant: str = "", fingerprint: str | None = None,
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
    s = _codec(request).open(value)
    if s is None:
        _audit_refusal(request, "missing_key" if not value else "unknown_key")
        raise Refused(401, "sign in with an auditor or admin API key")
    if _logouts(request).signed_out(s):
        _audit_refusal(request, "signed_out", tenant=s.tenant)
        raise Refused(401, "this session was signed out: sign in again")
    keys: KeyStore = request.app.state.keys
    why = auth.still_valid(keys, s)
    if why is not None:
        _audit_refusal(request, why)
        raise Refused(401, "your session ended (the key is no longer valid): sign in again")
    if roles and s.role not in roles:
        _audit_refusal(request, "forbidden", tenant=s.tenant)
        raise Refused(403, f"role {s.role.value} may not do this (needs {', '.join(sorted(r.value for r in roles))})")
    return s


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    response = templates.TemplateResponse(request, template, context, status_code=status)
    response.headers.update(HEADERS)
    return response


def _error(request: Request, status: int, title: str, detail: str, s: auth.ConsoleSession | None) -> HTMLResponse:
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
        return body(s, caller(s.principal), _kernel(request))
    except Refused as e:
        return _error(request, e.status, "Sign in" if e.status == 401 else "Forbidden", e.detail, s)
    except FakError as e:
        status = e.status if 400 <= e.status < 500 else 500
        detail = (str(e).splitlines() or [e.code])[0] if status < 500 else "internal error (logged on the server)"
        return _error(request, status, e.code.replace("_", " "), detail, s)


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the only kind the console's forms send)."""
    body = await request.body()
    if len(body) > MAX_FORM:
        raise Refused(413, "form too large")
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=16)
    except ValueError:  # more fields than any console form has
        raise Refused(400, "not a console form") from None
    return {k: v[0] for k, v in fields.items()}


def _csrf_ok(s: auth.ConsoleSession, form: dict[str, str], request: Request) -> None:
    if not auth.same_token(s.csrf, form.get("csrf")):
        _audit_refusal(request, "forbidden", tenant=s.tenant)
        raise Refused(403, "the form's CSRF token is missing or wrong: reload the page and try again")


async def post_page(request: Request, roles: tuple[Role, ...],
                    body: Callable[[auth.ConsoleSession, Caller, Kernel, dict[str, str]], Response]) -> Response:
    """``page`` for a form POST: the session's CSRF token must come back in the form."""
    try:
        form = await _form(request)
    except Refused as e:
        return _error(request, e.status, "Refused", e.detail, None)

    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        _csrf_ok(s, form, request)
        return body(s, c, k, form)

    return page(request, roles, run)


# --- sign-in ------------------------------------------------------------------------------
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
        form = await _form(request)
    except Refused as e:
        return _error(request, e.status, "Refused", e.detail, None)
    if not auth.same_token(auth.cookie(request, auth.LOGIN_COOKIE), form.get("csrf")):
        _audit_refusal(request, "forbidden")
        return _error(request, 403, "Forbidden", "the sign-in form's CSRF token is missing or wrong: reload it", None)
    keys: KeyStore = request.app.state.keys
    key = form.get("key", "").strip() or None
    check = keys.check(key)
    if check.principal is None:
        _audit_refusal(request, check.reason or "unknown_key", fingerprint=check.fingerprint, presented=key)
        return _login_page(request, 401, "that key is not valid (unknown, revoked or expired)")
    who = check.principal
    if who.role not in auth.CONSOLE_ROLES:
        _audit_refusal(request, "forbidden", tenant=who.tenant)
        return _error(request, 403, "Forbidden",
                      f"role {who.role.value} may not sign in to the console (needs admin, auditor, approver)", None)
    s = auth.start(who)
    # a person who decides held calls lands on their queue; the other pages are the auditors'
    landing = "/console/tool-calls" if who.role is Role.APPROVER else "/console/sessions"
    response = RedirectResponse(landing, status_code=303, headers=HEADERS)
    auth.set_cookie(response, request, auth.COOKIE, _codec(request).seal(s), max(1, s.expires_s - int(time.time())))
    auth.clear_cookie(response, request, auth.LOGIN_COOKIE)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: the session is recorded as signed out (``auth.Logouts``) before the answer, so
    its cookie is refused from now on wherever it is presented, not only cleared here."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        _logouts(request).record(s)
        response = RedirectResponse("/console/login", status_code=303, headers=HEADERS)
        auth.clear_cookie(response, request, auth.COOKIE)
        return response

    return await post_page(request, (), run)


# --- sessions -----------------------------------------------------------------------------
@router.get("/sessions")
def sessions(request: Request) -> Response:
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        listed = ops.list_sessions(k, c).sessions
        return render(request, "sessions.html", s=s, sessions=listed)

    return page(request, (), run)


@router.get("/sessions/{sid}")
def session_page(sid: str, request: Request) -> Response:
    """One session's ledger and its provenance graph (refs -> segments -> generated turns)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        out = ops.get_session(k, c, sid)
        segments = [x.model_dump() for x in out.segments]
        return render(request, "session.html", s=s, session=out, segments=segments,
                      graph=provenance_svg(segments))

    return page(request, (), run)


# --- refs ---------------------------------------------------------------------------------
def _ref_holders(k: Kernel, c: Caller, digest: str) -> tuple[list[dict[str, Any]], bool]:
    """Segments of the tenant's sessions that hold the ref or whose provenance names it, at most
    ``ops.HOLDERS`` (and whether there are more): one bounded query of the durable ledgers, so
    the page costs the same with 10 sessions or 10,000 and never loads or locks one."""
    found, more = ops.ref_holders(k, c, digest)
    return [{"session": h.session, "segment": h.segment, "kind": h.kind, "state": h.state,
             "how": "holds" if h.holds else "attended to it"} for h in found], more


@router.get("/refs")
def refs_lookup(request: Request, digest: str = "") -> Response:
    """A ref by digest (a form on every page)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        if digest:
            return RedirectResponse("/console/refs/" + quote(digest.strip(), safe=":"), status_code=303,
                                    headers=HEADERS)
        return render(request, "ref_lookup.html", s=s)

    return page(request, (), run)


@router.get("/refs/{digest}")
def ref_page(digest: str, request: Request) -> Response:
    """What is known of a ref: its CAS head, verdicts, the sessions that hold it, its history."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        head, state = None, "live"
        try:
            head = ops.find_ref(k, c, digest)
        except NotFound:
            state = "unknown"
        except FakError as e:
            if e.status != 410:
                raise
            state = "forgotten"
        history = _newest(k, c, needles=[digest])
        if head is None and not history:
            raise NotFound(f"no ref {digest}")
        verdicts = [e for e in history if e["type"] == "admission_verdict"]
        holders, more = _ref_holders(k, c, digest) if head is not None else ([], False)
        return render(request, "ref.html", s=s, digest=digest, head=head, state=state, history=history,
                      verdicts=verdicts, holders=holders, more_holders=more)

    return page(request, (), run)


@router.post("/refs/{digest}/forget")
async def forget(digest: str, request: Request) -> Response:
    """Admins: a confirmation page first (``confirm`` absent), then the forget and its receipt,
    verified against the log's pinned key."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        body = ForgetIn(ref=digest, reason=form.get("reason") or None)
        if form.get("confirm") != "yes":
            holders, more = _ref_holders(k, c, body.ref)
            return render(request, "forget_confirm.html", s=s, digest=body.ref, reason=body.reason or "",
                          holders=holders, more_holders=more)
        receipt = ops.forget(k, c, body).model_dump(mode="json")
        return _receipt_page(request, s, k, receipt)

    try:
        return await post_page(request, (Role.ADMIN,), run)
    except ValueError as e:  # the form's digest or reason failed the wire model
        return _error(request, 400, "invalid input", str(e).splitlines()[0], None)


# --- receipts -----------------------------------------------------------------------------
def _replays(receipt: dict[str, Any]) -> dict[str, str | None]:
    """Each session's replay fingerprint: inline (older receipts) or from the logged
    ``replay_verified`` event the completed receipt carries (verified with it)."""
    out: dict[str, str | None] = {}
    for x in receipt.get("sessions") or []:
        if isinstance(x, dict) and x.get("fingerprint_replay"):
            out[str(x.get("session_id"))] = x["fingerprint_replay"]
    event = receipt.get("replay_event")
    if isinstance(event, str):
        try:
            for x in json.loads(event).get("sessions", []):
                out[str(x.get("session_id"))] = x.get("fingerprint_replay")
        except (ValueError, AttributeError):
            pass  # verify_receipt has said what is wrong with it
    return out


def _receipt_page(request: Request, s: auth.ConsoleSession, k: Kernel, receipt: dict[str, Any] | None,
                  problem: str | None = None, status: int = 200) -> HTMLResponse:
    check = verify_receipt(receipt, k.audit.public_key()) if receipt is not None else None
    return render(request, "receipt.html", status, s=s, receipt=receipt, check=check, problem=problem,
                  pubkey=k.audit.public_key(), replays=_replays(receipt) if receipt is not None else {},
                  pasted=json.dumps(receipt, indent=2) if receipt is not None else "")


@router.get("/receipts/{request_id}")
def receipt_of(request_id: str, request: Request) -> Response:
    """A forget's receipt as it stands now (with its replay once logged), verified."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        st = ops.forget_status(k, c, request_id)
        if "receipt" not in st and "log_index" not in st:
            return render(request, "forget_pending.html", s=s, forget=st)
        for extra in ("state", "replay"):  # forget_status adds these beside the receipt's own fields
            st.pop(extra, None)
        return _receipt_page(request, s, k, st)

    return page(request, (), run)


@router.get("/receipts")
def receipts(request: Request) -> Response:
    return page(request, (), lambda s, c, k: _receipt_page(request, s, k, None))


@router.post("/receipts")
async def receipts_verify(request: Request) -> Response:
    """A pasted receipt, verified against this log's pinned key (as ``fak audit verify-receipt``)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        try:
            receipt = json.loads(form.get("receipt", ""))
        except ValueError as e:
            return _receipt_page(request, s, k, None, f"not JSON: {e}", 400)
        if not isinstance(receipt, dict):
            return _receipt_page(request, s, k, None, "a receipt is a JSON object", 400)
        return _receipt_page(request, s, k, receipt)

    return await post_page(request, (), run)


# --- audit --------------------------------------------------------------------------------
def _ms(text: str) -> int | None:
    """A ``datetime-local`` field (UTC) as epoch milliseconds; None when empty or malformed."""
    try:
        return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000) if text else None
    except ValueError:
        return None


def _checkpoint(k: Kernel, c: Caller) -> dict[str, Any]:
    """The latest checkpoint: the log's signature and each witness's cosignature, and its age."""
    cp = ops.audit_checkpoint(k, c)
    sigs = [line[2:].split(" ", 1)[0] for line in cp.checkpoint.split("\n\n", 1)[-1].splitlines()
            if line.startswith("\u2014 ")]
    signed = checkpoint_time(SignedCheckpoint(origin=cp.origin, size=cp.size, root=bytes.fromhex(cp.root_hash),
                                              note=cp.checkpoint))
    return {"cp": cp, "log_signer": [n for n in sigs if n == cp.origin],
            "witnesses": [n for n in sigs if n != cp.origin],
            "age_s": None if signed is None else max(0, int(time.time()) - signed)}


def _newest(k: Kernel, c: Caller, keep: Callable[[dict[str, Any]], bool] | None = None, types: Sequence[str] = (),
            needles: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The tenant's newest entries of ``types`` holding every one of ``needles`` (filtered in the
    database, ``ops.audit_newest``) that ``keep`` accepts, newest first, at most ``SHOWN``. Read
    in pages from the end of the log back; with ``keep``, at most ``SCAN`` entries, so a page
    costs what it shows, not the size of the log."""
    shown: list[dict[str, Any]] = []
    before, scanned = k.audit.size(), 0
    while len(shown) < SHOWN and scanned < SCAN:
        got = ops.audit_newest(k, c, before, SHOWN if keep is None else MAX_LIMIT, types, needles).entries
        page: list[dict[str, Any]] = [{"index": e.index, "type": e.type, "text": e.event} for e in got]
        shown += [e for e in page if keep is None or keep(e)]
        scanned += len(got)
        if keep is None or len(got) < MAX_LIMIT:
            break
        before = got[-1].index
    for e in shown[:SHOWN]:
        e.setdefault("event", json.loads(e["text"]))  # parsed only for what is shown
    return shown[:SHOWN]


@router.get("/audit")
def audit(request: Request, type: str = "", session: str = "", ref: str = "",  # noqa: A002 - the filter's name
          since: str = "", until: str = "") -> Response:
    """The tenant's entries (newest first) with filters, the latest checkpoint, the signer alarm."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        alarm = k.audit.alarm
        cp = None
        if alarm is None:
            try:  # signs a checkpoint if the tree grew: a rewritten history raises the alarm here
                cp = _checkpoint(k, c)
            except AuditUnverified:
                alarm = k.audit.alarm
            except (AuditError, FakError):
                cp = None  # no checkpoint to show (the page says so); the entries still are
        if alarm is not None:
            return render(request, "audit.html", 409, s=s, alarm=alarm.kind, entries=[], checkpoint=None,
                          filters={}, types=[])
        lo, hi = _ms(since), _ms(until)

        def in_time(e: dict[str, Any]) -> bool:
            ts = e.setdefault("event", json.loads(e["text"])).get("ts")
            return not ((lo is not None and (ts is None or ts < lo)) or (hi is not None and (ts is None or ts > hi)))

        shown = _newest(k, c, in_time if (lo, hi) != (None, None) else None, types=[type] if type else [],
                        needles=[x for x in (session, ref) if x])
        for e in shown:
            ts = e["event"].get("ts")
            e["time"] = datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="seconds") if ts else ""
        return render(request, "audit.html", s=s, alarm=None, entries=shown, checkpoint=cp, types=TYPES,
                      filters={"type": type, "session": session, "ref": ref, "since": since, "until": until})

    return page(request, (), run)


def _server_check(proof: dict[str, Any], body: bytes, vkey: str) -> str | None:
    """What is wrong with an entry's proof as the server sees it (None: nothing), the same checks
    the page's script makes again in the browser."""
    try:
        p = InclusionProof.from_json(proof)
        p.verify(hash_leaf(body))
        cp = open_checkpoint(p.checkpoint or "", Verifier.parse(vkey))
        if (cp.size, cp.root) != (p.tree_size, p.root_hash):
            return "the checkpoint names another tree than the proof"
    except (AuditError, ValueError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


@router.get("/audit/entries/{index}")
def audit_entry(index: int, request: Request) -> Response:
    """One of the tenant's entries with its inclusion proof against the latest checkpoint: checked
    here by the server and again in the browser (``inclusion.js``) against the key the auditor
    pinned there. Another tenant's index is a 404, as the API's proof route answers it."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        if index < 0:
            raise NotFound(f"no audit entry at index {index}")
        proof = ops.audit_inclusion(k, c, index)
        assert isinstance(proof, w.InclusionOut)
        found = ops.audit_entries(k, c, index, 1).entries
        if not found or found[0].index != index or proof.proof.get("logIndex") != index:
            raise NotFound(f"no audit entry at index {index}")
        entry = found[0]
        checked = _server_check(proof.proof, entry.event.encode(), k.audit.public_key())
        data = {"entry": entry.event, "leaf_hash": proof.leaf_hash, "proof": proof.proof,
                "server_key": k.audit.public_key()}
        return render(request, "audit_entry.html", s=s, entry=entry, event=json.loads(entry.event),
                      proof=proof.proof, checked=checked, data=data)

    return page(request, (), run)


@router.get("/tool-calls")
def tool_calls(request: Request, held: str = "") -> Response:
    """The calls held for a person; the tool-call decisions and approvals from the audit log,
    newest first, for a role that reads the log; a held call by id."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        if held.strip():
            return RedirectResponse("/console/tool-calls/held/" + quote(held.strip(), safe=""), status_code=303,
                                    headers=HEADERS)
        calls = _newest(k, c, types=("tool_call_decision", "tool_call_approval")) if ops.Right.AUDIT in c.rights else []
        return render(request, "tool_calls.html", s=s, calls=calls, pending=k.services.holds.pending(c.tenant),
                      now=time.time(), audits=ops.Right.AUDIT in c.rights)

    return page(request, HELD_ROLES, run)


def _held(request: Request, s: auth.ConsoleSession, c: Caller, k: Kernel, call_id: str,
          decided: w.ToolCallApprovalOut | None = None) -> HTMLResponse:
    """A held call: tool, session, rule, offending refs, findings, state; its arguments only for
    a role that reads tool-call content or decides held calls (the person deciding sees what the
    call would do, as the API's approve route answers them). The decision buttons only where
    this key may decide: the ``approve`` right, and never the key whose request produced it."""
    call = k.services.holds.get(c.tenant, call_id)
    if call is None:
        raise NotFound(f"no held tool call {call_id[:80]!r} (unknown, expired, or its record fails its check)")
    decides = ops.Right.APPROVE in c.rights
    shown = ops.reads_held_call(c) and call.arguments is not None
    arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False) if shown else None
    may_approve = decides and not same_principal(call.producer, c.principal) and call.arguments is not None
    return render(request, "held.html", s=s, call=call, arguments=arguments, decided=decided, decides=decides,
                  may_approve=may_approve)


@router.get("/tool-calls/held/{call_id}")
def held_call(call_id: str, request: Request) -> Response:
    return page(request, HELD_ROLES, lambda s, c, k: _held(request, s, c, k, call_id))


@router.post("/tool-calls/held/{call_id}")
async def decide_held(call_id: str, request: Request) -> Response:
    """A person (an approver or admin key) approves or rejects a held call (``decision``):
    audited as the API's approve/reject, with the same rule (the key whose request produced the
    call may not approve it)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        decision = form.get("decision")
        if decision not in ("approve", "reject"):
            raise InvalidInput("decision must be approve or reject")
        decided = chat.decide_held_call(k, c, call_id, approve=decision == "approve")
        return _held(request, s, c, k, call_id, decided)

    return await post_page(request, (Role.APPROVER, Role.ADMIN), run)


# --- metrics ------------------------------------------------------------------------------
def _series(request: Request, tenant: str) -> dict[str, dict[str, float]]:
    """The tenant's samples of the app's collectors (``Metrics.registry``, as /metrics shows
    them): sample name -> the sample's other label values joined -> value."""
    out: dict[str, dict[str, float]] = {}
    registry = getattr(getattr(request.app.state, "metrics", None), "registry", None)
    if registry is None:
        return out
    for family in registry.collect():
        for sample in family.samples:
            if sample.labels.get("tenant") != tenant or sample.name.endswith("_created"):
                continue
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("tenant", "le"))
            if "le" in sample.labels:
                continue  # histogram buckets: the page shows counts and sums
            bucket = out.setdefault(sample.name, {})
            bucket[label] = bucket.get(label, 0.0) + sample.value
    return out


def _rate(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "—"


@router.get("/metrics")
def metrics_page(request: Request) -> Response:
    """The tenant's figures since the server started: verdict rates, prefix and PIC hit rates,
    forgets, decode throughput, time to first token (what ``GET /metrics`` exposes)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        c.require(ops.Right.AUDIT)  # as GET /metrics
        m = _series(request, c.tenant)
        verdicts = {key.removeprefix("kind="): v for key, v in m.get("fak_admission_verdicts_total", {}).items()}
        calls = {key.removeprefix("verdict="): v for key, v in m.get("fak_tool_call_decisions_total", {}).items()}
        total_v, total_c = sum(verdicts.values()), sum(calls.values())
        rows: list[tuple[str, str]] = []
        rows += [(f"admission {kind}", f"{int(n)} ({_rate(n, total_v)})") for kind, n in sorted(verdicts.items())]
        rows += [(f"tool call {v}", f"{int(n)} ({_rate(n, total_c)})") for v, n in sorted(calls.items())]
        rows += [(f"evictions {key.removeprefix('mode=')}", str(int(n)))
                 for key, n in sorted(m.get("fak_evictions_total", {}).items())]
        rows.append(("forgets completed", str(int(sum(m.get("fak_forgets_total", {}).values())))))
        n_f, sum_f = (sum(m.get(f"fak_forget_duration_seconds_{x}", {}).values()) for x in ("count", "sum"))
        rows.append(("forget latency (mean)", f"{1000 * sum_f / n_f:.0f} ms" if n_f else "—"))
        tokens = sum(m.get("fak_decode_tokens_total", {}).values())
        seconds = sum(m.get("fak_decode_seconds_total", {}).values())
        rows.append(("decode throughput", f"{tokens / seconds:.1f} tokens/s ({int(tokens)} tokens)" if seconds
                     else "—"))
        n_ft, sum_ft = (sum(m.get(f"fak_time_to_first_token_seconds_{x}", {}).values()) for x in ("count", "sum"))
        rows.append(("time to first token (mean)", f"{1000 * sum_ft / n_ft:.0f} ms" if n_ft else "—"))
        if k.prefix is not None:
            st = k.prefix.stats_for(k.namespace(c.tenant))
            rows.append(("prefix-cache hit rate", _rate(st.hit_tokens, st.hit_tokens + st.miss_tokens)))
        pic = k.pic.stats_for(k.namespace(c.tenant))
        rows.append(("PIC chunk hit rate", _rate(pic.hits, pic.lookups)))
        rows += [(f"late detections {key.removeprefix('outcome=')}", str(int(n)))
                 for key, n in sorted(m.get("fak_late_detections_total", {}).items())]
        history: MetricsHistory = request.app.state.metrics_history
        now = Sample(time.time(), tenant_totals(request.app.state.metrics.registry, k).get(c.tenant, {}))
        charts = [(x, sparkline(x)) for x in series([*history.samples(c.tenant), now])]
        return render(request, "metrics.html", s=s, rows=rows, charts=charts, interval=int(history.interval_s))

    return page(request, (), run)
