"""Error base class and the errors every layer shares.

Anything raised as a FakError is a user-facing problem (bad input, missing file,
refused operation): the CLI prints its message without a traceback, and the API
turns it into ``application/problem+json`` whose ``type`` is the class's stable
``code`` and whose status is its ``status`` hint.

Every subclass either names its own ``code`` (snake_case, unique across fak) or
inherits its parent's; ``error_codes()`` lists them all. A layer's "not found"
subclasses ``NotFound`` rather than inventing a new code, so a client needs to
know a handful of codes, not one per layer.
"""

from __future__ import annotations

import re

_CODE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_REGISTRY: dict[str, type[FakError]] = {}  # code -> the class that defined it


class FakError(Exception):
    """A clear, user-facing error. Subclass per layer, naming its ``code`` and ``status`` in the
    class header: ``class Gone(FakError, code="gone", status=410)`` (or as class attributes)."""

    code: str = "internal"
    status: int = 500
    param: str | None = None  # the request parameter at fault, when one is (OpenAI's ``error.param``)

    def __init__(self, *args: object, param: str | None = None) -> None:
        super().__init__(*args)
        if param is not None:
            self.param = param

    def __init_subclass__(cls, *, code: str | None = None, status: int | None = None,
                          **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in (("code", code), ("status", status)):
            if value is not None:
                if name in cls.__dict__:
                    raise TypeError(f"{cls.__qualname__} names its {name} twice (header and body)")
                setattr(cls, name, value)
        _register(cls)


def _register(cls: type[FakError]) -> None:
    code, status = cls.code, cls.status
    if not isinstance(code, str) or not _CODE.fullmatch(code):
        raise TypeError(f"{cls.__qualname__}.code must be snake_case, got {code!r}")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise TypeError(f"{cls.__qualname__}.status must be an HTTP status (int), got {status!r}")
    if "code" not in cls.__dict__:  # inherited: registered by the ancestor that defined it
        if status != _REGISTRY[code].status:
            raise TypeError(f"{_name(cls)} changes the status of code {code!r}: give it a code of its own")
        return
    owner = _REGISTRY.get(code)
    if owner is None or _name(owner) == _name(cls):  # new, or the same class redefined (reload)
        _REGISTRY[code] = cls
    elif not issubclass(cls, owner):
        raise TypeError(f"error code {code!r} of {_name(cls)} is already used by {_name(owner)}")
    elif owner.status != status:
        raise TypeError(f"{_name(cls)} repeats the code {code!r} of {_name(owner)} with another status")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_REGISTRY[FakError.code] = FakError


def error_codes() -> dict[str, int]:
    """Every registered error code and its status hint, e.g. ``{"not_found": 404, ...}``.
    Only classes whose modules have been imported are listed."""
    return {code: cls.status for code, cls in sorted(_REGISTRY.items())}


def error_class(code: str) -> type[FakError] | None:
    """The class that defined ``code`` (None if no imported class did)."""
    return _REGISTRY.get(code)


class InvalidInput(FakError, ValueError, code="invalid_input", status=400):
    """A malformed argument: a bad tenant, id, digest, URL, media type ..."""


class NotFound(FakError, code="not_found", status=404):
    """No such thing for this caller (also: it belongs to another tenant, so that the
    answer is no existence oracle)."""


class Conflict(FakError, code="conflict", status=409):
    """The operation contradicts the current state (a concurrent change, a duplicate)."""


class Forbidden(FakError, code="forbidden", status=403):
    """The caller may not do this (policy, role or tenant)."""


class Unavailable(FakError, code="unavailable", status=503):
    """A dependency (database, model, audit log) cannot serve now; retrying may help."""


class ContentStoreError(FakError):
    """The base of every error of the content store (``fak.cas.CasError`` and its subclasses:
    an unknown or forgotten ref, a destroyed key, ...). It lives here so that the shared ground
    can catch what the store raises through a protocol (``fak.state.seal.ContentKeys``) without
    importing the layer built on it; nothing raises it directly."""


def shown(value: object, limit: int = 80) -> str:
    """``repr`` of a value for an error message, cut to ``limit`` characters so that a
    huge or hostile input does not flood a log line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


PROBLEM_TYPE_BASE = "https://fak.dev/problems/"
"""problem+json ``type`` of an error is this + its code (the API and the SDK agree on it)."""

HTTP_STATUS_CODES = {
    400: "invalid_input", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "conflict", 413: "request_too_large", 415: "unsupported_media_type", 422: "invalid_input",
    429: "too_many_requests", 502: "bad_gateway", 503: "unavailable", 504: "gateway_timeout",
}
"""The code of a bare HTTP status (no FakError behind it): the server's and the SDK's one table."""
