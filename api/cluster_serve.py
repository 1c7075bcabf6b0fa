"""``fak serve --replicas N``: N kernels behind one port, on Ray Serve.

Each replica is a whole kernel (``Replica``: its model, sessions, KV and prefix caches, and
the same FastAPI app ``fak serve`` runs) in a Ray actor of its own, one Serve deployment per
replica (``replica-0`` … ``replica-<N-1>``, one actor each) so a replica has a stable name
that sessions are placed on. They share the governance plane (PostgreSQL: sessions'
placement, keys, audit, CAS) and the data directory (the master secret and audit signing
key files: secrets never travel in a deployment's arguments).

``Router`` is the ingress: it reads a request, asks ``fak.api.cluster_router`` where it
goes, and streams it through that replica's app in process (``Replica.handle`` runs the
ASGI app and yields the answer's start, then its body chunks, so server-sent events stay a
stream). A session's requests go to its owner: the affinity cache, else a replica's 421
``session_elsewhere`` answer names it (the router re-sends once). A request that may start
a conversation asks every replica's ``score`` (prefix-cache hit tokens of its prompt, load)
and goes where the most of its prompt is cached. ``/metrics`` is every replica's, labelled
``replica``; ``/healthz`` is the router's own. The answer names its replica in
``x-fak-replica``; a request that carries ``x-fak-replica: <name>`` goes to that replica
alone (tests and operators reach one kernel: its ``/healthz``, its view of a ref).

Ray is imported here only, and only when a cluster starts (it is the ``scale`` extra:
``pip install 'fak[scale]'``); the classes are plain until ``build_app`` makes them
deployments, so importing this module costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from fak.api.cluster_router import (
    BALANCE_SLACK,
    ELSEWHERE_STATUS,
    REPLICA_HEADER,
    AffinityCache,
    Kind,
    Placement,
    Route,
    Score,
    classify,
    credential,
    credential_digest,
    elsewhere,
    least_loaded,
    merge_metrics,
    parse_json,
    place,
    prompt_key,
    response_handle,
)
from fak.errors import FakError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp

    from fak.api.keys import KeyStore
    from fak.kernel.facade import Kernel
    from fak.settings import Settings

log = logging.getLogger("fak.cluster")

SECRETS = frozenset({"master_secret", "audit_signing_key"})  # read by each replica from the data dir or FAK_* env
SCORE_TIMEOUT_S = 2.0  # a replica that has not scored by then is left out of the placement
MAX_ONGOING = 512  # requests one replica (or the router) holds at once; the kernel's own admission says 429 first
OBJECT_STORE_BYTES = 200 * 1024**2
APP_NAME = "fak"
RAY_MISSING = "fak serve --replicas needs Ray Serve: pip install 'fak[scale]'"

# the first item Replica.handle yields: status, headers, the first body chunk, and whether more follows
# (a JSON answer is one item; a stream's chunks follow as bytes)
Head = tuple[int, list[tuple[str, str]], bytes, bool]


class ClusterError(FakError):
    """A replicated deployment that cannot start as configured."""


def check_replicated(settings: Settings, replicas: int) -> None:
    """Refuse what N kernels cannot share: a SQLite database (one process owns it) or key store."""
    if replicas < 1:
        raise ClusterError("--replicas: at least 1")
    if replicas == 1:
        return
    for name, url in (("database_url", settings.database_url), ("cas_key_url", settings.cas_key_url)):
        if not url or not url.startswith("postgresql"):
            raise ClusterError(f"--replicas {replicas}: the replicas share one governance plane, so {name} must be "
                               f"a PostgreSQL URL (FAK_{name.upper()}=postgresql+psycopg://...), not "
                               f"{'the default SQLite file' if not url else url.split(':', 1)[0]}")


def replica_names(replicas: int) -> list[str]:
    return [f"replica-{i}" for i in range(replicas)]


def shared_settings(settings: Settings) -> dict[str, Any]:
    """What every replica is built from: the settings as JSON values, without the secrets and
    without ``replica`` (each replica adds its own name)."""
    return settings.model_dump(mode="json", exclude={*SECRETS, "replica"})


# --- one kernel ------------------------------------------------------------------------------
async def stream_asgi(app: ASGIApp, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                      body: bytes, client: tuple[str, int] | None = None, *,
                      name: str = "replica") -> AsyncIterator[Head | bytes]:
    """Run one request through an ASGI app in process: yields the head (status, headers, the
    first body chunk, whether more follows), then the rest of the body in the chunks the app
    sent. A caller that stops reading (its client went away) reaches the app as
    ``http.disconnect``, so a stream's cleanup runs as it does under uvicorn."""
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Mapping[str, Any]) -> None:
        await messages.put(dict(message))

    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": quote(path).encode("ascii"),
        "query_string": query, "root_path": "", "client": client, "server": None,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }

    async def run() -> None:
        try:
            await app(scope, receive, send)
        except Exception:  # the app's error middleware has answered 500 when it could
            log.exception("%s: %s %s failed", name, method, path)
            await messages.put({"type": "http.response.start", "status": 500, "headers": []})
        finally:
            await messages.put(None)

    task = asyncio.create_task(run())
    head: tuple[int, list[tuple[str, str]]] | None = None
    sent = False
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start" and head is None:
                head = (int(message["status"]),
                        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])])
            elif message["type"] == "http.response.body" and head is not None:
                chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
                if not sent:  # the head travels with the first chunk: one message for a whole JSON answer
                    sent = True
                    yield (*head, chunk, more)
                elif chunk:
                    yield chunk
                if not more:
                    break
        if not sent:  # the app ended without a body (or without answering at all)
            yield (*(head or (500, [])), b"", False)
    finally:
        gone.set()  # the app sees the client leave (a stream's rollback) or has finished
        if task.done():
            task.result()


def score_request(kernel: Kernel, keys: KeyStore, key: str | None, session_id: str | None,
                  messages: list[dict[str, str]], response_id: str | None = None) -> dict[str, Any]:
    """What placing a request on ``kernel`` would mean: ``authorized`` (the key, checked as the
    app checks it), ``owner`` (the replica holding the named session, or the session of the
    named response's chain; None when there is none), ``hit_tokens`` (the prompt's tokens in
    this kernel's prefix cache for the key's tenant) and ``load`` (sessions loaded + generations)."""
    check = keys.check(key)
    if check.principal is None:
        return {"authorized": False}
    tenant = check.principal.tenant
    if session_id is None and response_id is not None:  # a Responses chain lives in its first response's session
        row = kernel.state.response(tenant, response_id)
        session_id = row.session_id if row is not None else None
    owner = kernel.placement_of(tenant, session_id) if session_id is not None else None
    hit = kernel.prefix_hit_tokens(tenant, messages) if messages and owner is None else 0
    return {"authorized": True, "owner": owner, "hit_tokens": hit, "load": kernel.replica_load()}


class Replica:
    """One kernel and its app in a Ray actor (a Serve deployment of one replica)."""

    def __init__(self, settings: dict[str, Any], name: str) -> None:
        from fak.api.app import create_app
        from fak.api.malloc import limit_arenas
        from fak.kernel.facade import Kernel
        from fak.settings import Settings

        limit_arenas()  # the actor's process is this kernel's, as fak serve's is (api/malloc.py)
        self.name = name
        self._closed = True  # until the kernel is open (Serve calls __del__ after a failed constructor too)
        self._lifespan: AbstractAsyncContextManager[Any] | None = None
        self._starting = asyncio.Lock()
        self.kernel: Kernel = Kernel.open(Settings(**settings, replica=name))
        self.app = create_app(self.kernel)
        self.keys: KeyStore = self.app.state.keys
        self._closed = False

    async def _started(self) -> None:
        """The app's lifespan startup, once, on the actor's event loop (the constructor has none)."""
        if self._lifespan is not None:
            return
        async with self._starting:
            if self._lifespan is None:
                lifespan = self.app.router.lifespan_context(self.app)
                await lifespan.__aenter__()
                self._lifespan = lifespan

    def pid(self) -> int:
        """This replica's process (a test SIGKILLs it to watch Serve restart it)."""
        return os.getpid()

    def check_health(self) -> None:
        """Serve's health hook: a closed or broken kernel fails it, and Serve replaces the actor."""
        if self._closed:
            raise RuntimeError(f"{self.name}: kernel closed")
        self.kernel.replica_load()

    async def handle(self, method: str, path: str, query: bytes, headers: list[tuple[str, str]], body: bytes,
                     client: tuple[str, int] | None = None) -> AsyncIterator[Head | bytes]:
        """One request through this replica's app (``stream_asgi``), streamed back."""
        await self._started()
        async for item in stream_asgi(self.app, method, path, query, headers, body, client, name=self.name):
            yield item

    async def score(self, key: str | None, session_id: str | None, messages: list[dict[str, str]],
                    response_id: str | None = None) -> dict[str, Any]:
        """What placing a request here would mean (``score_request``), off the event loop."""
        return await asyncio.to_thread(score_request, self.kernel, self.keys, key, session_id, messages, response_id)

    async def shutdown(self) -> None:
        """The app's lifespan shutdown, then the kernel closed (once)."""
        if self._closed:
            return
        self._closed = True
        if self._lifespan is not None:
            with contextlib.suppress(Exception):
                await self._lifespan.__aexit__(None, None, None)
        await asyncio.to_thread(self.kernel.close)

    async def __del__(self) -> None:  # Serve awaits it when it stops the replica
        await self.shutdown()


# --- the ingress -----------------------------------------------------------------------------
def _wants_body(method: str, path: str) -> bool:
    """Whether routing reads the body (only the doors that name a session or carry a prompt)."""
    return method == "POST" and (path in ("/v1/sessions", "/v1/chat/completions", "/v1/responses")
                                 or (path.startswith("/v1/sessions/") and path.endswith("/messages")))


def _problem(status: int, code: str, detail: str, headers: Mapping[str, str] | None = None) -> Response:
    from fak.api.problems import problem

    response = problem(status, code, detail)
    for k, v in (headers or {}).items():
        response.headers[k] = v
    return response


class Router:
    """The ingress: one per cluster, a plain ``__call__`` over Starlette requests."""

    def __init__(self, replicas: dict[str, DeploymentHandle[Any]], placement: str = Placement.PREFIX.value,
                 balance_slack: int | None = BALANCE_SLACK, max_body: int | None = None) -> None:
        from fak.api.app import MAX_BODY

        self.handles = dict(replicas)
        self.streams = {n: h.options(stream=True) for n, h in self.handles.items()}
        self.names = sorted(self.handles)
        self.placement = Placement(placement)
        self.balance_slack = balance_slack
        self.max_body = MAX_BODY if max_body is None else max_body
        self.affinity = AffinityCache()
        self.inflight = dict.fromkeys(self.names, 0)
        self._turn = 0
        self._rng = random.Random()

    def check_health(self) -> None:
        return None

    async def __call__(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        method, path = request.method.upper(), request.scope["path"]
        pinned = request.headers.get(REPLICA_HEADER)
        if pinned is not None and pinned not in self.handles:
            return _problem(400, "unknown_replica", f"{REPLICA_HEADER}: no replica {pinned[:40]!r} (replicas: "
                                                    f"{', '.join(self.names)})")
        if path == "/healthz" and method in ("GET", "HEAD") and pinned is None:
            return JSONResponse({"status": "ok", "replicas": len(self.names)})
        body = await self._body(request)
        if body is None:
            return _problem(413, "request_too_large", f"request body over {self.max_body} bytes")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
        key = credential(headers)
        route = classify(method, path, parse_json(body) if _wants_body(method, path) else None)
        query: bytes = request.scope.get("query_string", b"")
        client = (request.client.host, request.client.port) if request.client is not None else None
        if pinned is not None:  # the client names the replica (tests, operators): that one answers, 421 included
            return await self._send(pinned, route, credential_digest(key), method, path, query, headers, body,
                                    client, retry=False)
        if route.kind is Kind.METRICS:
            return await self._metrics(method, path, query, headers, client)
        digest = credential_digest(key)
        handle = self._handle_of(route)
        target = self.affinity.get(digest, handle) if handle is not None else None
        if target is not None and target not in self.handles:
            target = None
        if route.kind is Kind.EACH:
            return await self._each(digest, method, path, query, headers, body, client)
        if target is None and route.kind is Kind.PLACE:
            target = await self._place(route, key)
        if target is None:
            target = self._any()
        return await self._send(target, route, digest, method, path, query, headers, body, client, retry=True)

    @staticmethod
    def _handle_of(route: Route) -> str | None:
        if route.session_id is not None:
            return route.session_id
        return response_handle(route.response_id) if route.response_id is not None else None

    async def _body(self, request: Request) -> bytes | None:
        """The request body, read whole (bounded: a 421 re-sends it), or None when over the limit."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def _any(self) -> str:
        """The least busy replica as this router sees it, turns taken among equals."""
        least = min(self.inflight.values())
        equals = [n for n in self.names if self.inflight[n] == least]
        self._turn += 1
        return equals[self._turn % len(equals)]

    async def _place(self, route: Route, key: str | None) -> str | None:
        """A new conversation's replica from every replica's score; None: route anywhere (a bad
        key, answered 401 by whichever replica gets it, or no replica scored in time)."""
        named = route.session_id is not None or route.response_id is not None
        if self.placement is Placement.RANDOM and not named:
            return self._rng.choice(self.names)
        messages = [dict(m) for m in route.messages] if self.placement is Placement.PREFIX else []

        async def one(name: str) -> tuple[str, Score | None]:
            try:
                raw = await asyncio.wait_for(
                    self.handles[name].score.remote(key, route.session_id, messages, route.response_id),
                    SCORE_TIMEOUT_S)
            except Exception as exc:  # a replica restarting or slow: placed among the others
                log.warning("score from %s failed: %s", name, exc)
                return name, None
            return name, Score(bool(raw.get("authorized")), raw.get("owner"), int(raw.get("hit_tokens", 0)),
                               int(raw.get("load", 0)))

        answers = dict(await asyncio.gather(*(one(n) for n in self.names)))
        # a replica's own load cannot count the placements racing this one: the requests this
        # router has sent it and not had an answer to yet are a floor under it
        scores = {n: replace(s, load=max(s.load, self.inflight[n])) for n, s in answers.items() if s is not None}
        if not scores or not all(s.authorized for s in scores.values()):
            return None
        if self.placement is Placement.LOAD and not named:
            return least_loaded({n: s.load for n, s in scores.items()})
        return place(scores, self.placement, self._rng, self.balance_slack, prompt_key(route.messages))

    async def _each(self, digest: str, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                    body: bytes, client: tuple[str, int] | None) -> Response:
        """Each replica in turn until one answers other than 404 (a held call is in one replica's
        memory; the others do not know it). Every replica answers 404 alike: the last one's."""
        answer: Response | None = None
        for name in self.names:
            answer = await self._send(name, Route(Kind.EACH), digest, method, path, query, headers, body, client,
                                      retry=False)
            if answer.status_code != 404:
                return answer
        assert answer is not None  # a deployment has at least one replica
        return answer

    async def _open(self, name: str, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                    body: bytes, client: tuple[str, int] | None) -> tuple[Head, DeploymentResponseGenerator[Any]]:
        stream = cast("DeploymentResponseGenerator[Any]", self.streams[name].handle.remote(
            method, path, query, headers, body, client))
        status, hs, first, more = await stream.__anext__()
        return (int(status), [(str(k), str(v)) for k, v in hs], bytes(first), bool(more)), stream

    async def _send(self, target: str, route: Route, digest: str, method: str, path: str, query: bytes,
                    headers: list[tuple[str, str]], body: bytes, client: tuple[str, int] | None, *,
                    retry: bool) -> Response:
        from starlette.responses import Response, StreamingResponse

        # counted until the answer's head arrives: what the replica's own load cannot see yet (a
        # running generation it counts itself), and nothing to leak when a client leaves mid-body
        self.inflight[target] += 1
        try:
            (status, out_headers, first, more), stream = await self._open(
                target, method, path, query, headers, body, client)
        except Exception as exc:  # the actor died or is restarting: its sessions are placed anew
            self.affinity.drop_replica(target)
            log.warning("%s %s on %s failed: %s", method, path, target, exc)
            return _problem(503, "replica_unavailable", f"{target} did not answer; retry",
                            {"Retry-After": "1", REPLICA_HEADER: target})
        finally:
            self.inflight[target] -= 1
        handle = self._handle_of(route)
        buffered: bytes | None = None
        if not more:
            buffered = first
        elif status == ELSEWHERE_STATUS or (status in (200, 201) and method == "POST"
                                             and path in ("/v1/sessions", "/v1/responses") and _json(out_headers)):
            buffered = first + b"".join([bytes(c) async for c in stream])
        if status == ELSEWHERE_STATUS and buffered is not None:
            owner = elsewhere(buffered)
            if handle is not None and owner is not None:
                self.affinity.put(digest, handle, owner)
            if retry and owner is not None and owner != target and owner in self.handles:
                return await self._send(owner, route, digest, method, path, query, headers, body, client,
                                        retry=False)
        elif 200 <= status < 300 and route.kind in (Kind.SESSION, Kind.PLACE):
            if handle is not None:
                self.affinity.put(digest, handle, target)
            if buffered is not None and method == "POST" and _json(out_headers):
                for created in _created_ids(path, buffered):
                    self.affinity.put(digest, created, target)
        elif status == 404 and handle is not None:
            self.affinity.discard(digest, handle)
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers
               if k.lower() != REPLICA_HEADER] + [(REPLICA_HEADER.encode(), target.encode())]
        if buffered is not None:
            response = Response(buffered, status_code=status)
        else:
            response = StreamingResponse(_relay(first, stream), status_code=status)
        response.raw_headers = raw
        return response

    async def _metrics(self, method: str, path: str, query: bytes, headers: list[tuple[str, str]],
                       client: tuple[str, int] | None) -> Response:
        """Every replica's /metrics under the caller's key, merged with a ``replica`` label; a
        replica's refusal (401, 403) is the answer as it gave it."""
        from starlette.responses import Response

        async def one(name: str) -> tuple[str, int, list[tuple[str, str]], bytes]:
            (status, hs, first, more), stream = await self._open(name, method, path, query, headers, b"", client)
            return name, status, hs, (first + b"".join([bytes(c) async for c in stream])) if more else first

        try:
            answers = await asyncio.gather(*(one(n) for n in self.names))
        except Exception as exc:
            return _problem(503, "replica_unavailable", f"a replica did not answer /metrics: {exc}"[:300],
                            {"Retry-After": "1"})
        for name, status, hs, body in answers:
            if status != 200:
                response = Response(body, status_code=status)
                response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in hs] + [
                    (REPLICA_HEADER.encode(), name.encode())]
                return response
        media = next((v for k, v in answers[0][2] if k.lower() == "content-type"), "text/plain; version=0.0.4")
        text = merge_metrics([(name, body.decode("utf-8", "replace")) for name, _, _, body in answers])
        return Response(text, media_type=media.split(";")[0], headers={REPLICA_HEADER: ",".join(self.names)})


async def _relay(first: bytes, stream: DeploymentResponseGenerator[Any]) -> AsyncIterator[bytes]:
    """The replica's body chunks as they come; a client that leaves cancels the replica's side."""
    try:
        if first:
            yield first
        async for chunk in stream:
            yield bytes(chunk)
    finally:
        stream.cancel()  # type: ignore[no-untyped-call]  # ray leaves it unannotated


def _json(headers: Sequence[tuple[str, str]]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("application/json") for k, v in headers)


def _created_ids(path: str, body: bytes | None) -> list[str]:
    """The affinity handles a successful answer creates: a new session's id (POST /v1/sessions),
    a stored response's id (POST /v1/responses, its chain continues from it)."""
    parsed = parse_json(body or b"")
    if not isinstance(parsed, dict) or not isinstance(parsed.get("id"), str):
        return []
    if path == "/v1/sessions":
        return [parsed["id"]]
    if path == "/v1/responses" and parsed.get("store", True) is not False:
        return [response_handle(parsed["id"])]
    return []


# --- the cluster -----------------------------------------------------------------------------
def build_app(settings: Settings, replicas: int, placement: Placement = Placement.PREFIX,
              balance_slack: int | None = BALANCE_SLACK) -> Any:
    """The Serve application: ``replicas`` one-actor deployments and the router over them."""
    try:
        from ray import serve
    except ImportError as exc:
        raise ClusterError(RAY_MISSING) from exc

    shared = shared_settings(settings)
    bound = {
        name: serve.deployment(name=name, num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                               ray_actor_options={"num_cpus": 0}, health_check_period_s=5,
                               graceful_shutdown_timeout_s=30)(Replica).bind(shared, name)
        for name in replica_names(replicas)
    }
    router = serve.deployment(name="router", num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                              ray_actor_options={"num_cpus": 0})(Router)
    return router.bind(bound, placement.value, balance_slack)


def run_cluster(settings: Settings, replicas: int, host: str = "127.0.0.1", port: int = 8077,
                placement: Placement = Placement.PREFIX, balance_slack: int | None = BALANCE_SLACK,
                ) -> DeploymentHandle[Any]:
    """Start Ray locally when none is connected, Serve's HTTP proxy on ``host:port`` and the
    application; returns the router's handle once every replica has opened its kernel."""
    check_replicated(settings, replicas)
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ClusterError(RAY_MISSING) from exc

    if not ray.is_initialized():
        # worker_niceness 0: Ray runs workers at nice 15 by default, and a replica's workers serve requests
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
                 logging_level=logging.WARNING, log_to_driver=True, _system_config={"worker_niceness": 0})
    serve.start(http_options={"host": host, "port": port})
    handle: DeploymentHandle[Any] = serve.run(build_app(settings, replicas, placement, balance_slack), name=APP_NAME,
                                         route_prefix="/", blocking=False)
    return handle


def replica_handle(name: str) -> DeploymentHandle[Any]:
    """A running replica's handle (tests: ``replica_handle("replica-1").pid.remote()``)."""
    from ray import serve

    return serve.get_deployment_handle(name, app_name=APP_NAME)


def shutdown_cluster() -> None:
    """Stop the application and Serve (each replica closes its kernel), then Ray if this process started it."""
    import ray
    from ray import serve

    if not ray.is_initialized():  # the start failed before Ray ran: nothing to stop (and no second error)
        return
    with contextlib.suppress(Exception):
        serve.delete(APP_NAME)
    serve.shutdown()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
    ray.shutdown()


def wait_ready(url: str, timeout_s: float = 300.0) -> float:
    """Seconds until the router answers ``/healthz`` at ``url`` (serve.run returns before the proxy listens)."""
    import httpx

    start = time.monotonic()
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while True:
            try:
                if client.get(url.rstrip("/") + "/healthz").status_code == 200:
                    return time.monotonic() - start
            except httpx.TransportError:
                pass
            if time.monotonic() - start > timeout_s:
                raise ClusterError(f"the router at {url} did not answer /healthz in {timeout_s:.0f} s")
            time.sleep(0.2)


__all__ = ["APP_NAME", "ClusterError", "Replica", "Router", "build_app", "check_replicated", "replica_handle",
           "replica_names", "run_cluster", "score_request", "shared_settings", "shutdown_cluster", "stream_asgi",
           "wait_ready"]
