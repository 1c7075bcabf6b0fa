"""The console's tool-call pages: the calls held for a person and the logged decisions; one
held call, approved or rejected by an approver or admin key."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from fak import wire as w
from fak.api.console import auth
from fak.api.console.common import HEADERS, page, post_page, render
from fak.api.console.pages_audit import newest_entries
from fak.api.keys import Role
from fak.errors import InvalidInput, NotFound
from fak.kernel.calls.held import same_principal
from fak.kernel.facade import Kernel
from fak.kernel.openai import chat
from fak.kernel.session.caller import Caller, Right, reads_held_call

router = APIRouter(prefix="/console", include_in_schema=False)
HELD_ROLES = (Role.AUDITOR, Role.ADMIN, Role.APPROVER)  # who sees held calls (approvers and admins decide them)


@router.get("/tool-calls")
def tool_calls(request: Request, held: str = "") -> Response:
    """The calls held for a person; the tool-call decisions and approvals from the audit log,
    newest first, for a role that reads the log; a held call by id."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        if held.strip():
            return RedirectResponse("/console/tool-calls/held/" + quote(held.strip(), safe=""), status_code=303,
                                    headers=HEADERS)
        calls = newest_entries(k, c, types=("tool_call_decision", "tool_call_approval")) if Right.AUDIT in c.rights else []
        return render(request, "tool_calls.html", s=s, calls=calls, pending=k.services.holds.pending(c.tenant),
                      now=time.time(), audits=Right.AUDIT in c.rights)

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
    decides = Right.APPROVE in c.rights
    shown = reads_held_call(c) and call.arguments is not None
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
