"""Errors as ``application/problem+json`` (RFC 9457) with a stable ``type`` per kernel
error code: ``https://fak.dev/problems/<code>``. Unexpected exceptions become a 500 that
says nothing about internals.

Every problem also carries OpenAI's error envelope, ``"error": {"message", "type", "param",
"code"}`` (``code``: fak's problem code), so that OpenAI clients (the ``openai`` package, the
frameworks built on it) show the reason: they read ``error.message``, not ``detail``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fak.errors import HTTP_STATUS_CODES, PROBLEM_TYPE_BASE, FakError

TYPE_BASE = PROBLEM_TYPE_BASE
MEDIA = "application/problem+json"
log = logging.getLogger("fak.api")



class Unauthorized(FakError):
    """No valid API key was presented."""

    code = "unauthorized"
    status = 401


OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_error"}
"""OpenAI's ``error.type`` of a status; any other 4xx is ``invalid_request_error``, a 5xx ``server_error``."""


def openai_error(status: int, code: str, message: str, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object for a problem: what ``str(e)`` of an ``openai`` client error shows."""
    kind = OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"message": message, "type": kind, "param": param, "code": code}


def problem(status: int, code: str, detail: str, *, headers: dict[str, str] | None = None,
            extra: dict[str, object] | None = None, param: str | None = None) -> JSONResponse:
    """An RFC 9457 problem+json answer with OpenAI's ``error`` envelope; ``extra``: the problem's
    extension members; ``param``: the request parameter at fault, if one is."""
    body = ({"type": TYPE_BASE + code, "title": code.replace("_", " "), "status": status, "detail": detail}
            | (extra or {}) | {"error": openai_error(status, code, detail, param)})
    headers = dict(headers or {}) | ({"WWW-Authenticate": "Bearer"} if status == 401 else {})
    return JSONResponse(body, status_code=status, media_type=MEDIA, headers=headers or None)


UNAVAILABLE = "the database is unavailable; retry"


def no_route(method: str, path: str) -> str:
    """The message of a request no route matched (asked with or without a key: the routes
    are public, the answer tells nothing else)."""
    shown_path = path if len(path) <= 100 else path[:97] + "..."
    return (f"no route {method[:16]} {shown_path}: fak serves /v1/chat/completions, /v1/responses, /v1/models "
            "and its own API under /v1 (see docs/api.md)")


def database_down(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is the database failing to answer: a
    refused or dropped connection, a pool timeout, an I/O error. Such a request did not
    happen (its transaction never committed), so the answer is a 503 to retry, not a 500."""
    import sqlalchemy as sa

    transient: tuple[type[BaseException], ...] = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DisconnectionError, sa.exc.TimeoutError)
    try:
        import psycopg

        transient += (psycopg.OperationalError, psycopg.InterfaceError)
    except ImportError:  # pragma: no cover - the postgres extra is not installed
        pass
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 8:
        if isinstance(cur, transient):
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


def install(app: FastAPI) -> None:
    import sqlalchemy as sa

    @app.exception_handler(sa.exc.SQLAlchemyError)
    async def _database(_request: Request, exc: sa.exc.SQLAlchemyError) -> JSONResponse:
        if database_down(exc):
            log.error("database unavailable: %s", type(exc).__name__)
            return problem(503, "unavailable", UNAVAILABLE, headers={"Retry-After": "1"})
        log.exception("unhandled database error", exc_info=exc)
        return problem(500, "internal", "internal error (logged on the server)")

    @app.exception_handler(FakError)
    async def _fak(_request: Request, exc: FakError) -> JSONResponse:
        if exc.status >= 500 and database_down(exc):  # e.g. an audit append whose database went away
            log.error("%s (database unavailable): %s", exc.code, exc)
            return problem(503, "unavailable", UNAVAILABLE, headers={"Retry-After": "1"})
        extra: dict[str, object] = {}
        problems = getattr(exc, "problems", None)
        if problems:  # a policy's located errors, as the CLI prints them
            extra["errors"] = [str(p) for p in problems]
        members = getattr(exc, "problem_members", None)
        if callable(members):  # an error's own extension members (e.g. the audit alarm's kind)
            extra.update(members())
        status = exc.status if 400 <= exc.status < 600 else 500
        if status >= 500 and not getattr(exc, "public", False):  # says nothing about internals (a driver's
            # message, a path): logged instead; errors marked public say what the client can do (disk full)
            log.error("%s: %s", exc.code, exc)
            return problem(status, exc.code, "internal error (logged on the server)")
        retry = getattr(exc, "retry_after", None)  # an overloaded server says when to come back
        return problem(status, exc.code, (str(exc).splitlines() or [exc.code])[0], extra=extra,
                       param=getattr(exc, "param", None),
                       headers={"Retry-After": str(retry)} if isinstance(retry, int) else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return problem(400, "invalid_input", f"{where or 'request'}: {first.get('msg')}", param=where or None,
                       extra={"errors": [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg"))}
                                         for e in errors[:20]]})

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_STATUS_CODES.get(exc.status_code, "error")
        if exc.status_code == 404 and "route" not in request.scope:  # the router matched nothing
            return problem(404, code, no_route(request.method, request.url.path))
        return problem(exc.status_code, code, str(exc.detail), headers=dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        if database_down(exc):
            log.error("database unavailable: %s", type(exc).__name__)
            return problem(503, "unavailable", UNAVAILABLE, headers={"Retry-After": "1"})
        log.exception("unhandled error", exc_info=exc)
        return problem(500, "internal", "internal error (logged on the server)")
