"""HTTP clients for the fak API: ``Client`` (blocking) and ``AsyncClient`` (asyncio),
both over httpx, both returning the typed results of ``fak.sdk.models``.

    from fak.sdk import Client

    with Client("http://127.0.0.1:8077", api_key="fak_...") as fak:
        s = fak.create_session()
        s.append("system", "You are a travel assistant.")
        a = s.admit("flight_status", "LH123 is on time, gate B22.")
        print(a.verdict, a.ref)
        for piece in s.stream(max_tokens=64):
            print(piece, end="")

Retries: only idempotent calls (GET, HEAD, PUT, DELETE) are retried, on a transport
error (connection refused or reset, timeout) and on 502/503/504, with exponential
backoff and jitter (``Retry-After`` is honoured, capped at ``backoff_max``). A POST
(append, admit, generate, forget, ...) is sent once: a request whose answer was lost
may have taken effect, and the SDK cannot know.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from fak import __version__
from fak.sdk.errors import FakAPIError, FakConnectionError
from fak.sdk.models import (
    AdmissionOut,
    EvictionOut,
    ForgetReceipt,
    ForgetStatus,
    GenerateOut,
    MaterialiseOut,
    QuarantineOut,
    RefsEvictedOut,
    SegmentOut,
    SessionList,
    SessionOut,
    StreamDone,
    ToolCallDecisionOut,
)

if TYPE_CHECKING:
    from fak.sdk.models import CheckpointOut, EntriesOut, EntryOut, InclusionOut, ReceiptCheckOut

T = TypeVar("T")
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUS = frozenset({502, 503, 504})
USER_AGENT = f"fak-sdk/{__version__}"


# --- requests, shared by the blocking and the asyncio client ---------------------
@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call: what to send and how to read a 2xx answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: dict[str, Any] | None = None
    raw: bool = False  # parse gets the httpx.Response, not its JSON


def _model(cls: type[T]) -> Callable[[Any], T]:
    return cls.model_validate  # type: ignore[attr-defined]


def _sampling(max_tokens: int, min_tokens: int, temperature: float, top_p: float, seed: int | None,
              stream: bool) -> dict[str, Any]:
    return {"max_tokens": max_tokens, "min_tokens": min_tokens, "temperature": temperature, "top_p": top_p,
            "seed": seed, "stream": stream}


def tool_body(tool: str, content: str | bytes, media_type: str, tags: Sequence[str],
              source: str | None = None) -> dict[str, Any]:
    """A ``ToolResultIn`` body: text as ``content``, bytes as ``content_b64``."""
    body: dict[str, Any] = {"tool": tool, "media_type": media_type, "tags": list(tags)}
    if source is not None:
        body["source"] = source
    if isinstance(content, bytes | bytearray | memoryview):
        body["content_b64"] = base64.b64encode(bytes(content)).decode("ascii")
    else:
        body["content"] = content
    return body


def working_set(refs: Iterable[str], exclude: Iterable[str], budget_tokens: int | None,
                model_id: str | None, tokenizer_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"refs": list(refs), "exclude": list(exclude)}
    for name, value in (("budget_tokens", budget_tokens), ("model_id", model_id), ("tokenizer_id", tokenizer_id)):
        if value is not None:
            body[name] = value
    return body


def _lazy(name: str) -> Callable[[Any], Any]:
    def parse(body: Any) -> Any:
        from fak.sdk import models

        return getattr(models, name).model_validate(body)

    return parse


@dataclass(frozen=True)
class RefInfo:
    """``HEAD /v1/refs/{ref}``: a ref's size, media type and taint."""

    ref: str
    size: int
    media_type: str
    taint: str


def _ref_info(r: httpx.Response) -> RefInfo:
    return RefInfo(ref=r.headers.get("etag", "").strip('"'), size=int(r.headers.get("content-length") or 0),
                   media_type=r.headers.get("content-type", "").split(";")[0],
                   taint=r.headers.get("x-fak-taint", ""))


def _forget_status(body: dict[str, Any]) -> ForgetStatus:
    body = dict(body)
    state = body.pop("state", "completed")
    body.pop("replay", None)  # the receipt says it too (``ForgetReceipt.replay``)
    if state != "completed":
        return ForgetStatus(request_id=body["request_id"], ref=body["ref"], state=state)
    receipt = ForgetReceipt.model_validate(body)
    return ForgetStatus(request_id=receipt.request_id, ref=receipt.ref, state=state, receipt=receipt)


class Calls:
    """The routes, as ``Call`` values (one place for paths and bodies)."""

    @staticmethod
    def health() -> Call[dict]:
        return Call("GET", "/healthz", dict)

    @staticmethod
    def create_session(sid: str | None) -> Call[SessionOut]:
        return Call("POST", "/v1/sessions", _model(SessionOut), json={"id": sid} if sid is not None else {})

    @staticmethod
    def sessions() -> Call[list[str]]:
        return Call("GET", "/v1/sessions", lambda b: SessionList.model_validate(b).sessions)

    @staticmethod
    def get_session(sid: str) -> Call[SessionOut]:
        return Call("GET", f"/v1/sessions/{sid}", _model(SessionOut))

    @staticmethod
    def append(sid: str, role: str, content: str) -> Call[SegmentOut]:
        return Call("POST", f"/v1/sessions/{sid}/messages", _model(SegmentOut), json={"role": role, "content": content})

    @staticmethod
    def admit(sid: str, body: dict[str, Any]) -> Call[AdmissionOut]:
        return Call("POST", f"/v1/sessions/{sid}/tool-results", _model(AdmissionOut), json=body)

    @staticmethod
    def evict(sid: str, segment_id: str, mode: str | None, reason: str) -> Call[EvictionOut]:
        body: dict[str, Any] = {"segment_id": segment_id, "reason": reason}
        if mode is not None:
            body["mode"] = mode
        return Call("POST", f"/v1/sessions/{sid}/evict", _model(EvictionOut), json=body)

    @staticmethod
    def authorize_tool_call(sid: str, name: str, arguments: Any) -> Call[ToolCallDecisionOut]:
        body = {"name": name, "arguments": arguments}
        return Call("POST", f"/v1/sessions/{sid}/tool-calls/authorize", _model(ToolCallDecisionOut), json=body)

    @staticmethod
    def evict_refs(sid: str, refs: Sequence[str], drop_generated: bool, reason: str) -> Call[RefsEvictedOut]:
        body = {"refs": list(refs), "drop_generated": drop_generated, "reason": reason}
        return Call("POST", f"/v1/sessions/{sid}/evict-refs", _model(RefsEvictedOut), json=body)

    @staticmethod
    def materialise(sid: str, body: dict[str, Any]) -> Call[MaterialiseOut]:
        return Call("POST", f"/v1/sessions/{sid}/materialise", _model(MaterialiseOut), json=body)

    @staticmethod
    def generate(sid: str, body: dict[str, Any]) -> Call[GenerateOut]:
        return Call("POST", f"/v1/sessions/{sid}/generate", _model(GenerateOut), json=body)

    @staticmethod
    def forget(ref: str, reason: str | None) -> Call[ForgetReceipt]:
        body = {"ref": ref} | ({"reason": reason} if reason is not None else {})
        return Call("POST", "/v1/forget", _model(ForgetReceipt), json=body)

    @staticmethod
    def forget_status(request_id: str) -> Call[ForgetStatus]:
        return Call("GET", f"/v1/forget/{request_id}", _forget_status)

    @staticmethod
    def quarantine(ref: str, reason: str) -> Call[QuarantineOut]:
        return Call("POST", "/v1/quarantine", _model(QuarantineOut), json={"ref": ref, "reason": reason})

    @staticmethod
    def ref_content(ref: str) -> Call[bytes]:
        return Call("GET", f"/v1/refs/{ref}", lambda r: r.content, raw=True)

    @staticmethod
    def ref_head(ref: str) -> Call[RefInfo]:
        return Call("HEAD", f"/v1/refs/{ref}", _ref_info, raw=True)

    @staticmethod
    def audit_entries(start: int, limit: int) -> Call[Any]:
        return Call("GET", "/v1/audit/entries", _lazy("EntriesOut"), params={"start": start, "limit": limit})

    @staticmethod
    def audit_checkpoint() -> Call[Any]:
        return Call("GET", "/v1/audit/checkpoint", _lazy("CheckpointOut"))

    @staticmethod
    def audit_inclusion(index: int) -> Call[Any]:
        return Call("GET", f"/v1/audit/proof/inclusion/{index}", _lazy("InclusionOut"))

    @staticmethod
    def audit_inclusion_tlog(index: int) -> Call[str]:
        return Call("GET", f"/v1/audit/proof/inclusion/{index}", lambda r: r.text, params={"format": "tlog"},
                    raw=True)

    @staticmethod
    def audit_consistency(first: int, second: int | None) -> Call[dict]:
        params = {"first": first} | ({"second": second} if second is not None else {})
        return Call("GET", "/v1/audit/proof/consistency", dict, params=params)

    @staticmethod
    def verify_receipt(receipt: ForgetReceipt | dict[str, Any]) -> Call[Any]:
        body = receipt.model_dump(mode="json") if isinstance(receipt, ForgetReceipt) else receipt
        return Call("POST", "/v1/audit/receipts/verify", _lazy("ReceiptCheckOut"), json=body)


# --- answers --------------------------------------------------------------------
def _problem(r: httpx.Response) -> FakAPIError:
    try:
        body = r.json()
    except ValueError:
        body = None
    return FakAPIError.from_problem(r.status_code, body, r.text if body is None else "")


def _read(r: httpx.Response, call: Call[T]) -> T:
    if r.status_code >= 400:
        raise _problem(r)
    if call.raw:
        return call.parse(r)
    return call.parse(r.json())


def _delay(attempt: int, r: httpx.Response | None, backoff: float, backoff_max: float) -> float:
    if r is not None:
        after = r.headers.get("retry-after", "")
        if after.isdigit():
            return min(float(after), backoff_max)
    base = min(backoff_max, backoff * (2**attempt))
    return base * (0.5 + random.random() / 2)  # noqa: S311 - jitter, not crypto


@contextlib.contextmanager
def _sink(dest: str | os.PathLike[str] | IO[bytes]) -> Iterator[IO[bytes]]:
    if hasattr(dest, "write"):
        yield dest  # type: ignore[misc]
        return
    with open(dest, "wb") as f:  # noqa: PTH123
        yield f


def _headers(api_key: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    h = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h | (extra or {})


# --- server-sent events ------------------------------------------------------------
class _SSE:
    """Incremental parser of ``text/event-stream`` lines into (event, data) pairs."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, "\n".join(self.data))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


class _StreamState:
    """What a streamed generation has produced so far."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.done: StreamDone | None = None

    def on(self, event: str, data: str | dict[str, Any]) -> str | None:
        """Handle one event (data as JSON text, or already a dict); the text piece to yield, if any."""
        body = json.loads(data) if isinstance(data, str) else data
        if event == "done":
            self.done = StreamDone.model_validate(body)
            return None
        if event == "error":  # not sent by this server version, understood anyway
            raise FakAPIError.from_problem(int(body.get("status") or 500), body)
        self.tokens.append(int(body["token"]))
        text = body.get("text") or ""
        if text:
            self.pieces.append(text)
        return text or None

    def result(self) -> GenerateOut:
        if self.done is None:
            raise FakAPIError.from_problem(502, None, "the stream ended before its done event")
        return GenerateOut(text=self.text, tokens=self.tokens, segment=self.done.segment,
                           fingerprint=self.done.fingerprint)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class _StreamFields:
    """What a stream read so far (shared by the blocking and the async stream)."""

    _state: _StreamState

    @property
    def tokens(self) -> list[int]:
        return list(self._state.tokens)

    @property
    def text(self) -> str:
        return self._state.text

    @property
    def done(self) -> StreamDone | None:
        return self._state.done


class TextStream(_StreamFields, Iterator[str]):
    """A streamed generation: iterate for text pieces as they are decoded.

    After the last piece ``done`` holds the appended segment and the fingerprint,
    ``tokens`` every token id, ``text`` the whole text, and ``result()`` the same
    ``GenerateOut`` a non-streamed ``generate`` returns. ``close()`` (or leaving a
    ``with`` block) before the end gives the turn up: the server rolls it back and the
    session is as it was before the call."""

    def __init__(self, pieces: Iterator[tuple[str, Any]], close: Callable[[], None]) -> None:
        self._events = pieces
        self._close = close
        self._state = _StreamState()
        self._closed = False

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        if self._closed:
            raise StopIteration
        try:
            while True:
                event, data = next(self._events)
                piece = self._state.on(event, data)
                if piece is not None:
                    return piece
        except StopIteration:
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> GenerateOut:
        """Read to the end; the turn as ``generate`` would have returned it."""
        for _ in self:
            pass
        return self._state.result()


class AsyncTextStream(_StreamFields, AsyncIterator[str]):
    """``TextStream`` for ``AsyncClient``: ``async for piece in stream``; ``await aclose()``."""

    def __init__(self, pieces: AsyncIterator[tuple[str, str]], close: Callable[[], Any]) -> None:
        self._events = pieces
        self._close = close
        self._state = _StreamState()
        self._closed = False

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        if self._closed:
            raise StopAsyncIteration
        try:
            while True:
                event, data = await self._events.__anext__()
                piece = self._state.on(event, data)
                if piece is not None:
                    return piece
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._close()

    async def __aenter__(self) -> AsyncTextStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def result(self) -> GenerateOut:
        async for _ in self:
            pass
        return self._state.result()


# --- the blocking client --------------------------------------------------------
@dataclass
class _Options:
    retries: int = 2
    backoff: float = 0.25
    backoff_max: float = 8.0
    sleep: Callable[[float], Any] = field(default=time.sleep)


class Session:
    """A handle on one server session (``Client.create_session`` / ``Client.session``).
    Each method is one API call; nothing is cached on the handle but its id."""

    def __init__(self, client: Client, id: str) -> None:  # noqa: A002
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def info(self) -> SessionOut:
        """The session: token count, fingerprint, ledger."""
        return self.client.call(Calls.get_session(self.id))

    def ledger(self) -> list[SegmentOut]:
        """Every segment with its state, verdict, rule and provenance."""
        return self.info().segments

    def fingerprint(self) -> str:
        """BLAKE3 fingerprint of the live KV (equal fingerprints: equal caches)."""
        return self.info().fingerprint

    def append(self, role: str, content: str) -> SegmentOut:
        """Append a ``system`` or ``user`` message."""
        return self.client.call(Calls.append(self.id, role, content))

    def admit(self, tool: str, content: str | bytes, *, media_type: str = "text/plain",
              tags: Sequence[str] = (), source: str | None = None) -> AdmissionOut:
        """Send a tool result through the admission gate: the verdict, the ref, the segment.
        ``source``: the URL it came from (policy rules and trust may depend on its host)."""
        return self.client.call(Calls.admit(self.id, tool_body(tool, content, media_type, tags, source)))

    def evict(self, segment_id: str, mode: str | None = None, *, reason: str = "manual") -> EvictionOut:
        """Evict a live segment (``mode``: auto | write_time | recompute | rerope; default the policy's)."""
        return self.client.call(Calls.evict(self.id, segment_id, mode, reason))

    def authorize_tool_call(self, name: str, arguments: dict[str, Any] | str | None = None) -> ToolCallDecisionOut:
        """May the agent call ``name`` now? ALLOW, CONFIRM (a person approves) or DENY, from what
        is in attention; ``offending`` names the refs to evict (``evict_refs``) before asking again."""
        return self.client.call(Calls.authorize_tool_call(self.id, name, arguments))

    def evict_refs(self, refs: Sequence[str], *, drop_generated: bool = True,
                   reason: str = "tool_call") -> RefsEvictedOut:
        """Evict these refs exactly (RECOMPUTE), and the assistant turns produced while they were
        in attention unless ``drop_generated`` is false."""
        return self.client.call(Calls.evict_refs(self.id, refs, drop_generated, reason))

    def materialise(self, refs: Iterable[str] = (), exclude: Iterable[str] = (), budget_tokens: int | None = None,
                    *, model_id: str | None = None, tokenizer_id: str | None = None) -> MaterialiseOut:
        """Make the session's tool context this working set (refs or ``tag:``/``tool:`` selectors)."""
        return self.client.call(Calls.materialise(
            self.id, working_set(refs, exclude, budget_tokens, model_id, tokenizer_id)))

    def generate(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None) -> GenerateOut:
        """Generate an assistant turn (appended to the session)."""
        body = _sampling(max_tokens, min_tokens, temperature, top_p, seed, False)
        return self.client.call(Calls.generate(self.id, body))

    def stream(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None) -> TextStream:
        """``generate`` as server-sent events: a ``TextStream`` of text pieces."""
        body = _sampling(max_tokens, min_tokens, temperature, top_p, seed, True)
        return self.client.stream_text(f"/v1/sessions/{self.id}/generate", body)

    def chat(self, text: str, **sampling: Any) -> str:
        """Append a user message and return the generated answer's text."""
        self.append("user", text)
        return self.generate(**sampling).text


class Client:
    """Blocking client. ``base_url`` like ``http://127.0.0.1:8077``; ``api_key`` a
    ``fak_...`` key (``fak keys create``). ``timeout`` in seconds (or an
    ``httpx.Timeout``); ``retries`` for idempotent calls only (see the module doc).
    ``transport`` replaces the network (``httpx.MockTransport``; ``httpx.ASGITransport``
    is async-only); ``trust_env=False`` ignores proxy variables of the environment."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
                 retries: int = 2, backoff: float = 0.25, backoff_max: float = 8.0,
                 headers: dict[str, str] | None = None, transport: httpx.BaseTransport | None = None,
                 trust_env: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self._opt = _Options(retries=max(0, retries), backoff=backoff, backoff_max=backoff_max)
        self._http = httpx.Client(base_url=self.base_url, headers=_headers(api_key, headers), timeout=timeout,
                                  transport=transport, trust_env=trust_env)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # plumbing
    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        attempts = self._opt.retries + 1 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt + 1 == attempts
            try:
                r = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if last:
                    raise FakConnectionError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
                self._opt.sleep(_delay(attempt, None, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code in RETRY_STATUS and not last:
                r.close()
                self._opt.sleep(_delay(attempt, r, self._opt.backoff, self._opt.backoff_max))
                continue
            return r
        raise AssertionError("unreachable")  # pragma: no cover

    def call(self, call: Call[T]) -> T:
        """Send one typed ``Call`` (retried per the options) and read its typed answer; the
        building block ``Session`` methods share with the client's own."""
        r = self._send(call.method, call.path, json=call.json, params=call.params)
        return _read(r, call)

    def _open_stream(self, method: str, path: str) -> httpx.Response:
        """A streamed answer, retried (idempotent methods) until its status line arrives."""
        attempts = self._opt.retries + 1 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt + 1 == attempts
            try:
                r = self._http.send(self._http.build_request(method, path), stream=True)
            except httpx.TransportError as exc:
                if last:
                    raise FakConnectionError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
                self._opt.sleep(_delay(attempt, None, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code in RETRY_STATUS and not last:
                r.close()
                self._opt.sleep(_delay(attempt, r, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code >= 400:
                r.read()
                r.close()
                raise _problem(r)
            return r
        raise AssertionError("unreachable")  # pragma: no cover

    def stream_text(self, path: str, body: dict[str, Any]) -> TextStream:
        """POST ``body`` to ``path`` and read the server-sent events as a ``TextStream``
        (``Session.stream`` uses it)."""
        request = self._http.build_request("POST", path, json=body, headers={"Accept": "text/event-stream"})
        try:
            r = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise FakConnectionError(f"POST {path}: {exc.__class__.__name__}: {exc}") from exc
        if r.status_code >= 400:
            r.read()
            r.close()
            raise _problem(r)

        def events() -> Iterator[tuple[str, str]]:
            sse = _SSE()
            try:
                for line in r.iter_lines():
                    out = sse.feed(line)
                    if out is not None:
                        yield out
                out = sse.feed("")
                if out is not None:
                    yield out
            except httpx.TransportError as exc:
                raise FakConnectionError(f"POST {path}: the stream broke: {exc}") from exc

        return TextStream(events(), r.close)

    # the API
    def health(self) -> dict:
        """``GET /healthz`` (no key needed)."""
        return self.call(Calls.health())

    def create_session(self, id: str | None = None) -> Session:  # noqa: A002
        """A new session (``id`` chosen, or generated by the server)."""
        return Session(self, self.call(Calls.create_session(id)).id)

    def session(self, id: str) -> Session:  # noqa: A002
        """A handle on an existing session (no request is made)."""
        return Session(self, id)

    def get_session(self, id: str) -> SessionOut:  # noqa: A002
        return self.call(Calls.get_session(id))

    def sessions(self) -> list[str]:
        """Ids of the tenant's sessions, oldest first."""
        return self.call(Calls.sessions())

    def forget(self, ref: str, reason: str | None = None) -> ForgetReceipt:
        """Erase ``ref`` everywhere in the tenant (admin key); the signed receipt."""
        return self.call(Calls.forget(ref, reason))

    def forget_status(self, request_id: str) -> ForgetStatus:
        """A forget by request id (auditor or admin key)."""
        return self.call(Calls.forget_status(request_id))

    def quarantine(self, ref: str, reason: str) -> QuarantineOut:
        """Late detection: evict ``ref`` from every live session of the tenant."""
        return self.call(Calls.quarantine(ref, reason))

    # refs
    def ref_content(self, ref: str) -> bytes:
        """A ref's bytes (the tenant's own; verified by the server before sending)."""
        return self.call(Calls.ref_content(ref))

    def ref_head(self, ref: str) -> RefInfo:
        return self.call(Calls.ref_head(ref))

    # audit (auditor or admin key)
    def audit_entries(self, start: int = 0, limit: int = 100) -> EntriesOut:
        """One page of the tenant's audit entries from index ``start`` (``next_start`` for the next)."""
        return self.call(Calls.audit_entries(start, limit))

    def iter_audit_entries(self, start: int = 0, page: int = 500) -> Iterator[EntryOut]:
        """Every audit entry of the tenant from ``start``, page by page."""
        cursor: int | None = start
        while cursor is not None:
            out = self.audit_entries(cursor, page)
            yield from out.entries
            cursor = out.next_start

    def audit_checkpoint(self) -> CheckpointOut:
        """The latest signed checkpoint and the log's verifier key."""
        return self.call(Calls.audit_checkpoint())

    def audit_inclusion(self, index: int) -> InclusionOut:
        """Inclusion proof of the tenant's entry ``index`` against a signed checkpoint."""
        return self.call(Calls.audit_inclusion(index))

    def audit_inclusion_tlog(self, index: int) -> str:
        """The same proof in the C2SP tlog-proof text form."""
        return self.call(Calls.audit_inclusion_tlog(index))

    def audit_consistency(self, first: int, second: int | None = None) -> dict:
        """RFC 9162 consistency proof between tree sizes ``first`` and ``second`` (default: now)."""
        return self.call(Calls.audit_consistency(first, second))

    def iter_audit_export(self) -> Iterator[dict]:
        """The tenant's export, line by line: a head (checkpoint, key) then one entry with proof per line."""
        r = self._open_stream("GET", "/v1/audit/export")
        try:
            for line in r.iter_lines():
                if line:
                    yield json.loads(line)
        except httpx.TransportError as exc:
            raise FakConnectionError(f"GET /v1/audit/export: the stream broke: {exc}") from exc
        finally:
            r.close()

    def audit_export(self, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Write the tenant's export (JSON lines) to a path or binary file; the bytes written."""
        r = self._open_stream("GET", "/v1/audit/export")
        n = 0
        try:
            with _sink(dest) as out:
                for chunk in r.iter_bytes():
                    out.write(chunk)
                    n += len(chunk)
        except httpx.TransportError as exc:
            raise FakConnectionError(f"GET /v1/audit/export: the stream broke: {exc}") from exc
        finally:
            r.close()
        return n

    def verify_receipt(self, receipt: ForgetReceipt | dict[str, Any]) -> ReceiptCheckOut:
        """Ask the server to check a receipt with its own log key. For an independent check,
        pin the key once (``audit_checkpoint().public_key``) and use
        ``fak.audit.receipt.verify_receipt(receipt, pinned_key)`` offline."""
        return self.call(Calls.verify_receipt(receipt))


# --- the asyncio client -----------------------------------------------------------
class AsyncSession:
    """``Session`` for ``AsyncClient``: the same methods, awaited."""

    def __init__(self, client: AsyncClient, id: str) -> None:  # noqa: A002
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r})"

    async def info(self) -> SessionOut:
        return await self.client.call(Calls.get_session(self.id))

    async def ledger(self) -> list[SegmentOut]:
        return (await self.info()).segments

    async def fingerprint(self) -> str:
        return (await self.info()).fingerprint

    async def append(self, role: str, content: str) -> SegmentOut:
        return await self.client.call(Calls.append(self.id, role, content))

    async def admit(self, tool: str, content: str | bytes, *, media_type: str = "text/plain",
                    tags: Sequence[str] = (), source: str | None = None) -> AdmissionOut:
        return await self.client.call(Calls.admit(self.id, tool_body(tool, content, media_type, tags, source)))

    async def evict(self, segment_id: str, mode: str | None = None, *, reason: str = "manual") -> EvictionOut:
        return await self.client.call(Calls.evict(self.id, segment_id, mode, reason))

    async def authorize_tool_call(self, name: str,
                                  arguments: dict[str, Any] | str | None = None) -> ToolCallDecisionOut:
        return await self.client.call(Calls.authorize_tool_call(self.id, name, arguments))

    async def evict_refs(self, refs: Sequence[str], *, drop_generated: bool = True,
                         reason: str = "tool_call") -> RefsEvictedOut:
        return await self.client.call(Calls.evict_refs(self.id, refs, drop_generated, reason))

    async def materialise(self, refs: Iterable[str] = (), exclude: Iterable[str] = (),
                          budget_tokens: int | None = None, *, model_id: str | None = None,
                          tokenizer_id: str | None = None) -> MaterialiseOut:
        return await self.client.call(Calls.materialise(
            self.id, working_set(refs, exclude, budget_tokens, model_id, tokenizer_id)))

    async def generate(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                       top_p: float = 1.0, seed: int | None = None) -> GenerateOut:
        body = _sampling(max_tokens, min_tokens, temperature, top_p, seed, False)
        return await self.client.call(Calls.generate(self.id, body))

    async def stream(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                     top_p: float = 1.0, seed: int | None = None) -> AsyncTextStream:
        body = _sampling(max_tokens, min_tokens, temperature, top_p, seed, True)
        return await self.client.stream_text(f"/v1/sessions/{self.id}/generate", body)

    async def chat(self, text: str, **sampling: Any) -> str:
        await self.append("user", text)
        return (await self.generate(**sampling)).text


class AsyncClient:
    """``Client`` for asyncio: the same constructor and methods, awaited. ``transport``
    may be ``httpx.ASGITransport(app)`` to talk to an app in the same process."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
                 retries: int = 2, backoff: float = 0.25, backoff_max: float = 8.0,
                 headers: dict[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 trust_env: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self._opt = _Options(retries=max(0, retries), backoff=backoff, backoff_max=backoff_max,
                             sleep=asyncio.sleep)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(api_key, headers),
                                       timeout=timeout, transport=transport, trust_env=trust_env)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        attempts = self._opt.retries + 1 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt + 1 == attempts
            try:
                r = await self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                if last:
                    raise FakConnectionError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
                await self._opt.sleep(_delay(attempt, None, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code in RETRY_STATUS and not last:
                await r.aclose()
                await self._opt.sleep(_delay(attempt, r, self._opt.backoff, self._opt.backoff_max))
                continue
            return r
        raise AssertionError("unreachable")  # pragma: no cover

    async def call(self, call: Call[T]) -> T:
        """Send one typed ``Call`` (retried per the options) and read its typed answer; the
        building block ``AsyncSession`` methods share with the client's own."""
        r = await self._send(call.method, call.path, json=call.json, params=call.params)
        return _read(r, call)

    async def _open_stream(self, method: str, path: str) -> httpx.Response:
        attempts = self._opt.retries + 1 if method in IDEMPOTENT else 1
        for attempt in range(attempts):
            last = attempt + 1 == attempts
            try:
                r = await self._http.send(self._http.build_request(method, path), stream=True)
            except httpx.TransportError as exc:
                if last:
                    raise FakConnectionError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
                await self._opt.sleep(_delay(attempt, None, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code in RETRY_STATUS and not last:
                await r.aclose()
                await self._opt.sleep(_delay(attempt, r, self._opt.backoff, self._opt.backoff_max))
                continue
            if r.status_code >= 400:
                await r.aread()
                await r.aclose()
                raise _problem(r)
            return r
        raise AssertionError("unreachable")  # pragma: no cover

    async def stream_text(self, path: str, body: dict[str, Any]) -> AsyncTextStream:
        """POST ``body`` to ``path`` and read the server-sent events as an ``AsyncTextStream``
        (``AsyncSession.stream`` uses it)."""
        request = self._http.build_request("POST", path, json=body, headers={"Accept": "text/event-stream"})
        try:
            r = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise FakConnectionError(f"POST {path}: {exc.__class__.__name__}: {exc}") from exc
        if r.status_code >= 400:
            await r.aread()
            await r.aclose()
            raise _problem(r)

        async def events() -> AsyncIterator[tuple[str, str]]:
            sse = _SSE()
            try:
                async for line in r.aiter_lines():
                    out = sse.feed(line)
                    if out is not None:
                        yield out
                out = sse.feed("")
                if out is not None:
                    yield out
            except httpx.TransportError as exc:
                raise FakConnectionError(f"POST {path}: the stream broke: {exc}") from exc

        return AsyncTextStream(events(), r.aclose)

    async def health(self) -> dict:
        return await self.call(Calls.health())

    async def create_session(self, id: str | None = None) -> AsyncSession:  # noqa: A002
        return AsyncSession(self, (await self.call(Calls.create_session(id))).id)

    def session(self, id: str) -> AsyncSession:  # noqa: A002
        return AsyncSession(self, id)

    async def get_session(self, id: str) -> SessionOut:  # noqa: A002
        return await self.call(Calls.get_session(id))

    async def sessions(self) -> list[str]:
        return await self.call(Calls.sessions())

    async def forget(self, ref: str, reason: str | None = None) -> ForgetReceipt:
        return await self.call(Calls.forget(ref, reason))

    async def forget_status(self, request_id: str) -> ForgetStatus:
        return await self.call(Calls.forget_status(request_id))

    async def quarantine(self, ref: str, reason: str) -> QuarantineOut:
        return await self.call(Calls.quarantine(ref, reason))

    async def ref_content(self, ref: str) -> bytes:
        return await self.call(Calls.ref_content(ref))

    async def ref_head(self, ref: str) -> RefInfo:
        return await self.call(Calls.ref_head(ref))

    async def audit_entries(self, start: int = 0, limit: int = 100) -> EntriesOut:
        return await self.call(Calls.audit_entries(start, limit))

    async def iter_audit_entries(self, start: int = 0, page: int = 500) -> AsyncIterator[EntryOut]:
        cursor: int | None = start
        while cursor is not None:
            out = await self.audit_entries(cursor, page)
            for e in out.entries:
                yield e
            cursor = out.next_start

    async def audit_checkpoint(self) -> CheckpointOut:
        return await self.call(Calls.audit_checkpoint())

    async def audit_inclusion(self, index: int) -> InclusionOut:
        return await self.call(Calls.audit_inclusion(index))

    async def audit_inclusion_tlog(self, index: int) -> str:
        return await self.call(Calls.audit_inclusion_tlog(index))

    async def audit_consistency(self, first: int, second: int | None = None) -> dict:
        return await self.call(Calls.audit_consistency(first, second))

    async def iter_audit_export(self) -> AsyncIterator[dict]:
        r = await self._open_stream("GET", "/v1/audit/export")
        try:
            async for line in r.aiter_lines():
                if line:
                    yield json.loads(line)
        except httpx.TransportError as exc:
            raise FakConnectionError(f"GET /v1/audit/export: the stream broke: {exc}") from exc
        finally:
            await r.aclose()

    async def verify_receipt(self, receipt: ForgetReceipt | dict[str, Any]) -> ReceiptCheckOut:
        return await self.call(Calls.verify_receipt(receipt))
