"""The ingress of a replicated deployment: one ``Router`` per cluster (a Serve deployment) reads
each request, asks the routing rules (``fak.api.cluster.rules``) where it goes, and streams it
through that replica's app (``Replica.handle``), learning session affinity from the answers."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from fak.api.cluster.asgi import Head
from fak.api.cluster.rules import (
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

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger("fak.cluster")

SCORE_TIMEOUT_S = 2.0  # a replica that has not scored by then is left out of the placement


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
