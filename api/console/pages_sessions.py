"""The console's session pages: the tenant's sessions, and one session's ledger with its
provenance graph (refs -> segments -> generated turns)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fak.api.console import auth
from fak.api.console.common import page, render
from fak.api.console.graph import provenance_svg
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller

router = APIRouter(prefix="/console", include_in_schema=False)


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
