"""Where late-detector judges may send tool results, and which key variables they may send.

Both are the deployment's to decide, in its settings (``judge_egress``, ``judge_key_envs``:
``fak/settings.py``), never the policy's: a policy can be replaced over the API by an admin
key, and a policy that could name any URL and any environment variable could send every
tenant's tool results, and the server's own secrets as a bearer key, anywhere. A policy's
judge is accepted only where its URL is inside an allowed destination and its
``api_key_env`` is an allowed variable; the empty allow-lists (the default) allow no judge.

A destination is an origin (``https://judge.example.com``, ``http://127.0.0.1:8000``: any
path on it) or a URL prefix (``https://api.example.com/v1``: that path and below it, cut at
a ``/``). Hosts compare lower-cased, ports with the scheme's default filled in. Variables
whose name starts with ``FAK_`` (any case) are the server's own and are never allowed.

It lives in the shared ground because ``Settings`` validates its two lists with it (``fak/``
imports no layer built on it, ``tests/repo/test_layering.py``); the policy layer, which checks a
policy's judges against these allow-lists, re-exports it as ``fak.policy.egress``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORT = {"http": 80, "https": 443}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SERVER_PREFIX = "FAK_"


@dataclass(frozen=True)
class Destination:
    """A parsed judge URL or allow-list entry: scheme, host, port and path (no trailing ``/``)."""

    scheme: str
    host: str
    port: int
    path: str

    @property
    def origin(self) -> str:
        """``scheme://host:port``, as the audit log records a judge's destination."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def covers(self, other: Destination) -> bool:
        """``other`` is at this origin and at or below this path (a whole path segment)."""
        if (self.scheme, self.host, self.port) != (other.scheme, other.host, other.port):
            return False
        return not self.path or other.path == self.path or other.path.startswith(self.path + "/")


def parse_destination(url: str) -> Destination:
    """A judge URL or an allow-list entry, or ValueError saying what is wrong with it: an
    http(s) URL with a host, without user info (credentials never go in a URL here), a
    query or a fragment."""
    if not isinstance(url, str) or not url:
        raise ValueError("a destination is an http:// or https:// URL")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r:.120} is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORT or not parts.hostname:
        raise ValueError(f"{url!r:.120} is not an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise ValueError(f"{url!r:.120} carries user info ('…@'): no credentials in a URL, and the host is "
                         "what follows the '@'")
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise ValueError(f"{url!r:.120} has a query or fragment: give a base URL")
    host = parts.hostname.lower().rstrip(".")  # "example.com." is example.com
    if not host:
        raise ValueError(f"{url!r:.120} has no host")
    return Destination(scheme, host, port or _DEFAULT_PORT[scheme], parts.path.rstrip("/"))


def origin_of(url: str) -> str:
    """``scheme://host:port`` of a judge URL (what the audit log records)."""
    return parse_destination(url).origin


def check_key_env(name: str) -> str:
    """``name`` if it may be allow-listed as a judge's key variable, else ValueError."""
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r:.80} is not an environment variable name (letters, digits, '_')")
    if name.upper().startswith(SERVER_PREFIX):
        raise ValueError(f"{name} starts with {SERVER_PREFIX}: the server's own variables (its data dir, its "
                         "master secret, …) are never sent to a judge")
    return name


@dataclass(frozen=True)
class JudgeEgress:
    """The deployment's allow-lists for judges (empty: no judge may be configured)."""

    destinations: tuple[Destination, ...] = ()
    key_envs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, destinations: Iterable[str] = (), key_envs: Iterable[str] = ()) -> JudgeEgress:
        """From the settings' lists; ValueError naming the first bad entry."""
        return cls(tuple(parse_destination(d) for d in destinations),
                   frozenset(check_key_env(name) for name in key_envs))

    def allows_url(self, url: str) -> bool:
        try:
            target = parse_destination(url)
        except ValueError:
            return False
        return any(d.covers(target) for d in self.destinations)

    def allows_key_env(self, name: str) -> bool:
        return not name.upper().startswith(SERVER_PREFIX) and name in self.key_envs


CLOSED = JudgeEgress()
