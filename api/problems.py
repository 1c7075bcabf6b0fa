"""Errors as ``application/problem+json`` (RFC 9457) with a stable ``type`` per kernel
error code: ``https://fak.dev/problems/<code>``. Unexpected exceptions become a 500 that
says nothing about internals."""

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


def problem(status: int, code: str, detail: str, **extra: object) -> JSONResponse:
    body = {"type": TYPE_BASE + code, "title": code.replace("_", " "), "status": status, "detail": detail} | extra
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=MEDIA, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(FakError)
    async def _fak(_request: Request, exc: FakError) -> JSONResponse:
        extra: dict[str, object] = {}
        problems = getattr(exc, "problems", None)
        if problems:  # a policy's located errors, as the CLI prints them
            extra["errors"] = [str(p) for p in problems]
        status = exc.status if 400 <= exc.status < 600 else 500
        if status >= 500:  # says nothing about internals (a driver's message, a path): logged instead
            log.error("%s: %s", exc.code, exc)
            return problem(status, exc.code, "internal error (logged on the server)")
        return problem(status, exc.code, (str(exc).splitlines() or [exc.code])[0], **extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
        return problem(400, "invalid_input", f"{where}: {first.get('msg')}",
                       errors=[{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg"))} for e in errors[:20]])

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_STATUS_CODES.get(exc.status_code, "error")
        return problem(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem(500, "internal", "internal error (logged on the server)")
