"""Errors the SDK raises, the same in HTTP and in-process mode.

A server answer of ``application/problem+json`` (RFC 9457) becomes ``FakAPIError``
with the problem's ``status``, ``type`` (a stable URI, ``https://fak.dev/problems/<code>``),
``title`` and ``detail``; ``code`` is the last part of the type (``not_found``,
``session_busy``, ...). In-process mode (``fak.sdk.local``) raises the same class
for the kernel's ``FakError`` s, so code written against one mode catches the same
errors in the other. A request that never got an answer (connection refused, reset,
timed out, after any retries) raises ``FakConnectionError``.
"""

from __future__ import annotations

from typing import Any

from fak.errors import HTTP_STATUS_CODES, PROBLEM_TYPE_BASE

TYPE_BASE = PROBLEM_TYPE_BASE


class FakSDKError(Exception):
    """Base class of every error the SDK raises."""


class FakAPIError(FakSDKError):
    """A problem answer (4xx/5xx) from the API, or a kernel error in local mode."""

    def __init__(self, status: int, type: str, detail: str = "", *, title: str | None = None,  # noqa: A002
                 body: dict[str, Any] | None = None) -> None:
        self.status = status
        self.type = type
        self.detail = detail
        self.title = title or self.code.replace("_", " ")
        self.body = body or {"type": type, "title": self.title, "status": status, "detail": detail}
        super().__init__(f"{status} {self.code}: {detail}" if detail else f"{status} {self.code}")

    @property
    def code(self) -> str:
        """The stable error code: ``type`` without ``https://fak.dev/problems/``."""
        return self.type.rsplit("/", 1)[-1] if self.type else "error"

    @property
    def errors(self) -> list[Any]:
        """Located errors when the server sent them (bad request fields, a policy's problems)."""
        return list(self.body.get("errors") or [])

    @classmethod
    def from_problem(cls, status: int, body: object, fallback: str = "") -> FakAPIError:
        """From a response's status and parsed body (problem+json or anything else)."""
        if isinstance(body, dict) and isinstance(body.get("type"), str):
            return cls(int(body.get("status") or status), body["type"], str(body.get("detail") or ""),
                       title=body.get("title") if isinstance(body.get("title"), str) else None, body=body)
        code = HTTP_STATUS_CODES.get(status, "error")
        return cls(status, TYPE_BASE + code, fallback[:500])

    @classmethod
    def from_fak_error(cls, exc: BaseException) -> FakAPIError:
        """What the API would answer for a kernel ``FakError`` (see ``fak.api.problems``)."""
        code = getattr(exc, "code", "internal")
        status = getattr(exc, "status", 500)
        status = status if isinstance(status, int) and 400 <= status < 600 else 500
        lines = str(exc).splitlines()
        body: dict[str, Any] = {}
        problems = getattr(exc, "problems", None)
        if problems:
            body["errors"] = [str(p) for p in problems]
        detail = lines[0] if lines else code
        return cls(status, TYPE_BASE + code, detail,
                   body={"type": TYPE_BASE + code, "title": code.replace("_", " "), "status": status,
                         "detail": detail} | body)


class FakConnectionError(FakSDKError):
    """No answer from the server (after the retries an idempotent call is allowed)."""


def invalid_input(exc: Any) -> FakAPIError:
    """A pydantic ``ValidationError`` of a request body, worded as the API words it."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
    detail = f"{where}: {first.get('msg')}"
    return FakAPIError(400, TYPE_BASE + "invalid_input", detail, body={
        "type": TYPE_BASE + "invalid_input", "title": "invalid input", "status": 400, "detail": detail,
        "errors": [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg"))} for e in errors[:20]]})
