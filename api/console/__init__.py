"""The console at ``/console``: server-rendered pages for auditors and admins (docs/console.md).

Thin routes over ``fak.kernel.operations``, as the JSON API's are: the same ``Caller`` with the
rights of the signed-in key's role, so a page shows exactly what the API would answer that key
(another tenant's session id is a 404 page, an auditor's forget a 403 page). Sign-in, the
session cookie and CSRF are ``fak.api.console.auth``; every refusal is counted into the audit
log as the API's are (``AuthFailureWindow``).

One module per group of pages (``pages_signin``, ``pages_sessions``, ``pages_refs``,
``pages_receipts``, ``pages_audit``, ``pages_tool_calls``, ``pages_metrics``) over what every page
shares (``common``: the signed-in session, rendering, error pages); this module assembles them."""

from __future__ import annotations

from fastapi import APIRouter

from fak.api.console import (
    pages_audit,
    pages_metrics,
    pages_receipts,
    pages_refs,
    pages_sessions,
    pages_signin,
    pages_tool_calls,
)

__all__ = ["router"]

router = APIRouter()
for pages in (pages_signin, pages_sessions, pages_refs, pages_receipts, pages_audit, pages_tool_calls, pages_metrics):
    router.include_router(pages.router)
