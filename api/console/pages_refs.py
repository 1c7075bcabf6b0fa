"""The console's ref pages: a ref by digest (its CAS head, verdicts, the sessions that hold it,
its history) and an admin's forget of it, confirmed first, answered with its receipt."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from fak.api.console import auth
from fak.api.console.common import HEADERS, error_page, page, post_page, render
from fak.api.console.pages_audit import newest_entries
from fak.api.console.pages_receipts import receipt_page
from fak.api.keys import Role
from fak.errors import FakError, NotFound
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller
from fak.wire import ForgetIn

router = APIRouter(prefix="/console", include_in_schema=False)


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
        history = newest_entries(k, c, needles=[digest])
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
        return receipt_page(request, s, k, receipt)

    try:
        return await post_page(request, (Role.ADMIN,), run)
    except ValueError as e:  # the form's digest or reason failed the wire model
        return error_page(request, 400, "invalid input", str(e).splitlines()[0], None)
