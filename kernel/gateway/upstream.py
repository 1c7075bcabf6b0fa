"""The upstreams: OpenAI-compatible servers (vLLM, SGLang, llama.cpp's server, another fak,
a hosted API) that fak forwards a governed conversation to (docs/gateway.md).

Which upstreams exist is the deployment's decision (``Settings.upstreams``), never a
request's: a request names a model, and only a declared one is forwarded. fak posts to the
declared URL only, follows no redirect (a redirect is an error: the declared URL is the
allow-list), sends the key of the declared variable, and, where the upstream takes one
(vLLM), a per-tenant ``cache_salt``, so one tenant's prefix-cache hits can never reveal
another's prompts. What the upstream answers is read as the OpenAI chat-completions shape;
anything else is an ``UpstreamError`` (502) naming the upstream.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
import httpx

from fak.errors import FakError, InvalidInput, NotFound
from fak.kernel.model.scheduler import Overloaded
from fak.settings import Settings, UpstreamSettings

__all__ = ["Upstream", "UpstreamError", "UpstreamRefused", "Upstreams"]

MAX_BODY = 32 << 20  # bytes of one upstream answer read before it is refused


class UpstreamError(FakError, code="upstream_error", status=502):
    """The upstream could not be reached, failed, or answered something that is not an OpenAI
    chat completion (the message names the upstream, never its key nor its URL)."""

    public = True  # what the client can act on: which model failed and how


class UpstreamRefused(InvalidInput):
    """The upstream refused the request as invalid (its 4xx, relayed with its message)."""

    code = "upstream_refused"


@dataclass(frozen=True)
class Upstream:
    """One declared upstream: the name clients use, where it is and how fak talks to it."""

    name: str
    url: str
    model: str  # the name the upstream knows
    key: str | None = None
    cache_salt: bool = False
    timeout_s: float = 120.0
    max_connections: int = 64
    scores: bool = False  # a vLLM server that scores a continuation (``fak.kernel.gateway.score``)

    @classmethod
    def of(cls, name: str, spec: UpstreamSettings, key: str | None) -> Upstream:
        return cls(name=name, url=spec.url, model=spec.model or name, key=key, cache_salt=spec.cache_salt,
                   timeout_s=spec.timeout_s, max_connections=spec.max_connections, scores=spec.scores)

    @property
    def root(self) -> str:
        """The server's root: the URL without its API version (vLLM's ``/tokenize`` lives there)."""
        return self.url.removesuffix("/v1")

    def salt(self, tenant_salt: bytes) -> str | None:
        """The tenant's ``cache_salt`` for this upstream (None where it takes none): a keyed digest
        of the tenant, stable across requests (its prefix cache is reused) and unguessable."""
        if not self.cache_salt:
            return None
        return blake3.blake3(b"fak.cache_salt\x00" + self.name.encode(), key=tenant_salt).hexdigest()[:32]


class Upstreams:
    """The deployment's upstreams by model name, each with one pooled HTTP client; thread-safe."""

    def __init__(self, upstreams: Mapping[str, Upstream]) -> None:
        self._by_name = dict(upstreams)
        self._clients: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Upstreams:
        return cls({name: Upstream.of(name, spec, settings.upstream_key(name))
                    for name, spec in settings.upstreams.items()})

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def find(self, model: str) -> Upstream | None:
        return self._by_name.get(model)

    def get(self, model: str) -> Upstream:
        found = self._by_name.get(model)
        if found is None:
            raise NotFound(f"no model {model[:80]!r}")
        return found

    def _client(self, up: Upstream) -> httpx.Client:
        with self._lock:
            client = self._clients.get(up.name)
            if client is None:
                headers = {"authorization": f"Bearer {up.key}"} if up.key else {}
                limits = httpx.Limits(max_connections=up.max_connections,
                                      max_keepalive_connections=up.max_connections)
                client = self._clients[up.name] = httpx.Client(
                    base_url=up.url, headers=headers, follow_redirects=False, limits=limits,
                    timeout=httpx.Timeout(up.timeout_s, connect=min(up.timeout_s, 10.0)))
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # --- the two calls -----------------------------------------------------------
    def complete(self, up: Upstream, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed chat completion."""
        try:
            r = self._client(up).post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {up.name}: {type(exc).__name__}: {exc}") from None
        _check(up, r.status_code, r.headers, lambda: r.content)
        if len(r.content) > MAX_BODY:
            raise UpstreamError(f"upstream {up.name}: an answer over {MAX_BODY} bytes")
        try:
            out = r.json()
        except ValueError:
            raise UpstreamError(f"upstream {up.name}: the answer is not JSON") from None
        if not isinstance(out, dict) or not isinstance(out.get("choices"), list) or not out["choices"]:
            raise UpstreamError(f"upstream {up.name}: the answer is not a chat completion (no choices)")
        return out

    def post(self, up: Upstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON request to ``path`` under the server's root (the declared origin: no other host)."""
        try:
            r = self._client(up).post(up.root + path, json=body)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {up.name}: {type(exc).__name__}: {exc}") from None
        _check(up, r.status_code, r.headers, lambda: r.content)
        try:
            out = r.json()
        except ValueError:
            raise UpstreamError(f"upstream {up.name}: the answer to {path} is not JSON") from None
        if not isinstance(out, dict):
            raise UpstreamError(f"upstream {up.name}: the answer to {path} is not an object")
        return out

    def stream(self, up: Upstream, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of a streamed completion, as the upstream sends
        them; closing the iterator closes the upstream's stream."""
        try:
            with self._client(up).stream("POST", "/chat/completions", json=body) as r:
                _check(up, r.status_code, r.headers, r.read)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue  # comments, event names, keep-alives
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise UpstreamError(f"upstream {up.name}: a stream event is not JSON") from None
                    if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                        raise UpstreamError(f"upstream {up.name}: {_message(chunk)}")
                    if isinstance(chunk, dict):
                        yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {up.name}: {type(exc).__name__}: {exc}") from None


def _message(body: Any) -> str:
    """The error message of an OpenAI-style error body (bounded)."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("title")
            if isinstance(msg, str):
                return msg[:500]
        elif isinstance(err, str):
            return err[:500]
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail[:500]
    return "no message"


def _check(up: Upstream, status: int, headers: Mapping[str, str], content: Any) -> None:
    """Raise for an answer that is not a 200: a 4xx is the request's fault (relayed), a redirect
    is refused (the declared URL is the only destination), the rest is the upstream's."""
    if status == 200:
        return
    try:
        body = json.loads(content()[:MAX_BODY])
    except (ValueError, httpx.HTTPError):
        body = None
    if 300 <= status < 400:
        raise UpstreamError(f"upstream {up.name} answered a redirect ({status} to "
                            f"{headers.get('location', '?')[:200]!r}): fak follows none, declare the final URL")
    if status == 429:
        retry = headers.get("retry-after", "1")
        raise Overloaded(f"upstream {up.name} is overloaded: {_message(body)}",
                         retry_after=int(retry) if retry.isdigit() else 1)
    if status in (400, 404, 413, 422):
        raise UpstreamRefused(f"upstream {up.name} refused the request ({status}): {_message(body)}")
    raise UpstreamError(f"upstream {up.name} answered {status}: {_message(body)}")
