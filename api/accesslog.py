"""No credential in the access log (issue 25.5).

A key belongs in the ``Authorization`` (or ``X-API-Key``) header; one sent in the query
string is refused, but uvicorn's access log wrote the request line as received, key
included, into files that are kept, shipped and read by people who must not hold keys. A
filter on the ``uvicorn.access`` logger rewrites the logged path before any handler sees it:
the value of every query parameter named like a credential (``api_key``, ``key``, ``token``,
``access_token``, ``password``, ...) and every path segment or query value that looks like a
fak key (percent-encoded or not) becomes ``[redacted]``; the rest of the line is kept.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

REDACTED = "[redacted]"
ACCESS_LOGGER = "uvicorn.access"
# a parameter whose name is one of these, or contains one of the words, is a credential
_NAMES = {"key", "apikey", "token", "auth", "authorization", "bearer", "password", "passwd", "pwd", "secret",
          "sig", "signature", "cookie", "credential", "credentials", "jwt"}
_WORDS = ("key", "token", "secret", "passw", "auth", "credential", "signature")
_FAK_KEY = re.compile(r"fak_[0-9A-Za-z]{4}", re.IGNORECASE)  # the start of a key: fak_<key id>_<secret>


def _credential_name(name: str) -> bool:
    plain = re.sub(r"[^a-z0-9]", "", unquote_plus(name).lower())
    return plain in _NAMES or any(word in plain for word in _WORDS)


def _looks_like_a_key(value: str) -> bool:
    return bool(_FAK_KEY.search(unquote_plus(value)))


def redact_target(target: str) -> str:
    """``target`` (a request's path and query string, as logged) without credentials."""
    path, sep, query = target.partition("?")
    path = "/".join(REDACTED if _looks_like_a_key(seg) else seg for seg in path.split("/"))
    if not sep:
        return path
    pairs = []
    for pair in query.split("&"):
        name, eq, value = pair.partition("=")
        if _looks_like_a_key(name):
            pairs.append(REDACTED)
        elif eq and (_credential_name(name) or _looks_like_a_key(value)):
            pairs.append(f"{name}={REDACTED}")
        else:
            pairs.append(pair)
    return f"{path}?{'&'.join(pairs)}"


class RedactCredentials(logging.Filter):
    """Rewrites the path of uvicorn's access records: ``(client, method, path, version, status)``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_target(args[2]), *args[3:])
        return True


def install() -> None:
    """Put the filter on uvicorn's access logger once (a logger's filters outlive uvicorn's
    logging configuration, which replaces only handlers)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, RedactCredentials) for f in logger.filters):
        logger.addFilter(RedactCredentials())
