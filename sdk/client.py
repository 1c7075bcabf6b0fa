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

One implementation of each call: ``fak.sdk.calls`` builds the request and reads the answer,
``_exchange`` below decides retries without doing I/O, and the two clients differ only in
the transport that carries them out (``Client.call`` blocks, ``AsyncClient.call`` awaits).
``Session`` and ``BlockingAPI`` serve ``fak.sdk.local()`` too, over the kernel in process.

Retries: only idempotent calls (GET, HEAD, PUT, DELETE) are retried, on a transport
error (connection refused or reset, timeout) and on 502/503/504, with exponential
backoff and jitter (``Retry-After`` is honoured, capped at ``backoff_max``). A POST
(append, admit, generate, forget, ...) is sent once: a request whose answer was lost
may have taken effect, and the SDK cannot know.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import httpx

from fak import __version__
from fak.sdk import models as m
from fak.sdk.calls import Call, Calls, Lines, RefInfo, sampling, tool_body, working_set
from fak.sdk.errors import FakAPIError, FakConnectionError
from fak.sdk.streams import SSE, AsyncTextStream, TextStream

__all__ = ["AsyncClient", "AsyncSession", "AsyncTextStream", "BlockingAPI", "Call", "Calls", "Client", "RefInfo",
           "Session", "TextStream", "tool_body", "working_set"]

T = TypeVar("T")
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUS = frozenset({502, 503, 504})
USER_AGENT = f"fak-sdk/{__version__}"


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
    base = min(backoff_max, backoff * (2.0**attempt))
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


# --- one exchange, without I/O: what to do next, the transport does it ------------------
@dataclass
class _Options:
    retries: int = 2
    backoff: float = 0.25
    backoff_max: float = 8.0
    sleep: Callable[[float], Any] = field(default=time.sleep)


@dataclass(frozen=True)
class _Send:
    request: httpx.Request
    stream: bool


@dataclass(frozen=True)
class _Sleep:
    seconds: float


@dataclass(frozen=True)
class _Close:
    response: httpx.Response
    read: bool  # read the body first (a streamed error answer, for its problem document)


Action = _Send | _Sleep | _Close
Reply = httpx.Response | httpx.TransportError | None


def _exchange(call: Call[Any], request: httpx.Request, stream: bool,
              opt: _Options) -> Generator[Action, Reply, httpx.Response]:
    """Send ``request`` and retry it per the module doc; the response to read (a streamed one
    has a 2xx status: an error answer is raised here as ``FakAPIError``)."""
    method, path = call.method, call.path
    attempts = opt.retries + 1 if method in IDEMPOTENT else 1
    for attempt in range(attempts):
        last = attempt + 1 == attempts
        reply = yield _Send(request, stream)
        if isinstance(reply, httpx.TransportError):
            if last:
                raise FakConnectionError(f"{method} {path}: {reply.__class__.__name__}: {reply}") from reply
            yield _Sleep(_delay(attempt, None, opt.backoff, opt.backoff_max))
            continue
        assert reply is not None
        if reply.status_code in RETRY_STATUS and not last:
            yield _Close(reply, read=False)
            yield _Sleep(_delay(attempt, reply, opt.backoff, opt.backoff_max))
            continue
        if stream and reply.status_code >= 400:
            yield _Close(reply, read=True)
            raise _problem(reply)
        return reply
    raise AssertionError("unreachable")  # pragma: no cover


def _broken(call: Call[Any], exc: httpx.TransportError) -> FakConnectionError:
    return FakConnectionError(f"{call.method} {call.path}: the stream broke: {exc}")


class _Plan:
    """``_exchange`` as steps: ``next(reply)`` is the next action, or the final response."""

    def __init__(self, http: httpx.Client | httpx.AsyncClient, call: Call[Any], stream: bool,
                 opt: _Options) -> None:
        headers = {"Accept": "text/event-stream"} if call.op == "generate" else None
        request = http.build_request(call.method, call.path, json=call.json, params=call.params, headers=headers)
        self._steps = _exchange(call, request, stream, opt)

    def next(self, reply: Reply) -> Action | httpx.Response:
        try:
            return self._steps.send(reply)
        except StopIteration as done:
            response: httpx.Response = done.value
            return response


# --- the blocking API, over any transport (HTTP here, the kernel in fak.sdk.local) -------
class Session:
    """A handle on one session (``Client.create_session`` / ``Client.session``).
    Each method is one API call; nothing is cached on the handle but its id."""

    def __init__(self, client: BlockingAPI, id: str) -> None:  # noqa: A002
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id!r})"

    def info(self) -> m.SessionOut:
        """The session: token count, fingerprint, ledger."""
        return self.client.call(Calls.get_session(self.id))

    def ledger(self) -> list[m.SegmentOut]:
        """Every segment with its state, verdict, rule and provenance."""
        return self.info().segments

    def fingerprint(self) -> str:
        """BLAKE3 fingerprint of the live KV (equal fingerprints: equal caches)."""
        return self.info().fingerprint

    def append(self, role: str, content: str) -> m.SegmentOut:
        """Append a ``system`` or ``user`` message."""
        return self.client.call(Calls.append(self.id, role, content))

    def admit(self, tool: str, content: str | bytes, *, media_type: str = "text/plain",
              tags: Sequence[str] = (), source: str | None = None) -> m.AdmissionOut:
        """Send a tool result through the admission gate: the verdict, the ref, the segment.
        ``source``: the URL it came from (policy rules and trust may depend on its host)."""
        return self.client.call(Calls.admit(self.id, tool_body(tool, content, media_type, tags, source)))

    def evict(self, segment_id: str, mode: str | None = None, *, reason: str = "manual") -> m.EvictionOut:
        """Evict a live segment (``mode``: auto | write_time | recompute | rerope; default the policy's)."""
        return self.client.call(Calls.evict(self.id, segment_id, mode, reason))

    def authorize_tool_call(self, name: str, arguments: dict[str, Any] | str | None = None, *,
                            tool: Mapping[str, Any] | None = None) -> m.ToolCallDecisionOut:
        """May the agent call ``name`` now? ALLOW, CONFIRM (a person approves) or DENY, from what
        is in attention; ``offending`` names the refs to evict (``evict_refs``) before asking again.
        ``tool``: the tool's definition (OpenAI, bare function or MCP): a policy with
        ``from_schemas`` (the default) classifies a tool no rule names from its schema."""
        return self.client.call(Calls.authorize_tool_call(self.id, name, arguments, tool))

    def evict_refs(self, refs: Sequence[str], *, drop_generated: bool = True,
                   reason: str = "tool_call") -> m.RefsEvictedOut:
        """Evict these refs exactly (RECOMPUTE), and the assistant turns produced while they were
        in attention unless ``drop_generated`` is false."""
        return self.client.call(Calls.evict_refs(self.id, refs, drop_generated, reason))

    def materialise(self, refs: Iterable[str] = (), exclude: Iterable[str] = (), budget_tokens: int | None = None,
                    *, model_id: str | None = None, tokenizer_id: str | None = None) -> m.MaterialiseOut:
        """Make the session's tool context this working set (refs or ``tag:``/``tool:`` selectors)."""
        return self.client.call(Calls.materialise(
            self.id, working_set(refs, exclude, budget_tokens, model_id, tokenizer_id)))

    def generate(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None) -> m.GenerateOut:
        """Generate an assistant turn (appended to the session)."""
        body = sampling(max_tokens, min_tokens, temperature, top_p, seed, False)
        return self.client.call(Calls.generate(self.id, body))

    def stream(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None) -> TextStream:
        """``generate`` as server-sent events: a ``TextStream`` of text pieces. Until it ends
        or is closed the session is busy; closing it early rolls the turn back."""
        body = sampling(max_tokens, min_tokens, temperature, top_p, seed, True)
        return self.client.stream_text(Calls.generate(self.id, body))

    def chat(self, text: str, **sampling: Any) -> str:
        """Append a user message and return the generated answer's text."""
        self.append("user", text)
        return self.generate(**sampling).text


class BlockingAPI:
    """The blocking client's methods, over three primitives a transport provides: ``call``
    (one ``Call``, its typed answer), ``stream_text`` (a streamed generation) and
    ``export_chunks`` (the audit export's bytes)."""

    session_class: type[Session] = Session

    def call(self, call: Call[T]) -> T:
        raise NotImplementedError

    def stream_text(self, call: Call[Any]) -> TextStream:
        raise NotImplementedError

    def export_chunks(self) -> Iterator[bytes]:
        raise NotImplementedError

    def health(self) -> dict[str, Any]:
        """``GET /healthz`` (no key needed)."""
        return self.call(Calls.health())

    def create_session(self, id: str | None = None) -> Session:  # noqa: A002
        """A new session (``id`` chosen, or generated by the server)."""
        return self.session_class(self, self.call(Calls.create_session(id)).id)

    def session(self, id: str) -> Session:  # noqa: A002
        """A handle on an existing session (no request is made)."""
        return self.session_class(self, id)

    def get_session(self, id: str) -> m.SessionOut:  # noqa: A002
        return self.call(Calls.get_session(id))

    def sessions(self) -> list[str]:
        """Ids of the tenant's sessions, oldest first."""
        return self.call(Calls.sessions())

    def forget(self, ref: str, reason: str | None = None) -> m.ForgetReceipt:
        """Erase ``ref`` everywhere in the tenant (admin key); the signed receipt."""
        return self.call(Calls.forget(ref, reason))

    def forget_status(self, request_id: str) -> m.ForgetStatus:
        """A forget by request id (auditor or admin key)."""
        return self.call(Calls.forget_status(request_id))

    def quarantine(self, ref: str, reason: str) -> m.QuarantineOut:
        """Late detection: evict ``ref`` from every live session of the tenant."""
        return self.call(Calls.quarantine(ref, reason))

    # held tool calls (the OpenAI door's CONFIRM)
    def held_tool_calls(self, state: str = "pending", limit: int = 100) -> m.HeldCallList:
        """The tenant's calls held for a person, oldest first (``pending``: the queue to decide);
        an approver or admin key."""
        return self.call(Calls.held_tool_calls(state, limit))

    def held_tool_call(self, call_id: str) -> m.HeldCallOut:
        """One held call: its arguments, why it was held, who produced it, its state."""
        return self.call(Calls.held_tool_call(call_id))

    def approve_tool_call(self, call_id: str) -> m.ToolCallApprovalOut:
        """A person approves a call fak held: audited, naming this key (an approver or admin key,
        never the agent key whose request produced the call); its result may then enter."""
        return self.call(Calls.decide_tool_call(call_id, True))

    def reject_tool_call(self, call_id: str) -> m.ToolCallApprovalOut:
        """A person rejects a held call: the model reads a rejection notice as its result."""
        return self.call(Calls.decide_tool_call(call_id, False))

    # refs
    def ref_content(self, ref: str) -> bytes:
        """A ref's bytes (the tenant's own; verified by the server before sending)."""
        return self.call(Calls.ref_content(ref))

    def ref_head(self, ref: str) -> RefInfo:
        return self.call(Calls.ref_head(ref))

    # audit (auditor or admin key)
    def audit_entries(self, start: int = 0, limit: int = 100) -> m.EntriesOut:
        """One page of the tenant's audit entries from index ``start`` (``next_start`` for the next)."""
        return self.call(Calls.audit_entries(start, limit))

    def iter_audit_entries(self, start: int = 0, page: int = 500) -> Iterator[m.EntryOut]:
        """Every audit entry of the tenant from ``start``, page by page."""
        cursor: int | None = start
        while cursor is not None:
            out = self.audit_entries(cursor, page)
            yield from out.entries
            cursor = out.next_start

    def audit_checkpoint(self) -> m.CheckpointOut:
        """The latest signed checkpoint and the log's verifier key."""
        return self.call(Calls.audit_checkpoint())

    def audit_inclusion(self, index: int) -> m.InclusionOut:
        """Inclusion proof of the tenant's entry ``index`` against a signed checkpoint."""
        return self.call(Calls.audit_inclusion(index))

    def audit_inclusion_tlog(self, index: int) -> str:
        """The same proof in the C2SP tlog-proof text form."""
        return self.call(Calls.audit_inclusion_tlog(index))

    def audit_consistency(self, first: int, second: int | None = None) -> dict[str, Any]:
        """RFC 9162 consistency proof between tree sizes ``first`` and ``second`` (default: now)."""
        return self.call(Calls.audit_consistency(first, second))

    def iter_audit_export(self) -> Iterator[dict[str, Any]]:
        """The tenant's export, line by line: a head (checkpoint, key) then one entry with proof per line."""
        lines = Lines()
        for chunk in self.export_chunks():
            yield from map(json.loads, lines.feed(chunk))
        yield from map(json.loads, lines.end())

    def audit_export(self, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Write the tenant's export (JSON lines) to a path or binary file; the bytes written."""
        n = 0
        with _sink(dest) as out:
            for chunk in self.export_chunks():
                out.write(chunk)
                n += len(chunk)
        return n

    def verify_receipt(self, receipt: m.ForgetReceipt | dict[str, Any]) -> m.ReceiptCheckOut:
        """Ask the server to check a receipt with its own log key. For an independent check,
        pin the key once (``audit_checkpoint().public_key``) and use
        ``fak.audit.receipt.verify_receipt(receipt, pinned_key)`` offline."""
        return self.call(Calls.verify_receipt(receipt))


class Client(BlockingAPI):
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

    def _exchange(self, call: Call[Any], stream: bool = False) -> httpx.Response:
        plan = _Plan(self._http, call, stream, self._opt)
        step = plan.next(None)
        while not isinstance(step, httpx.Response):
            step = plan.next(self._do(step))
        return step

    def _do(self, action: Action) -> Reply:
        if isinstance(action, _Sleep):
            self._opt.sleep(action.seconds)
            return None
        if isinstance(action, _Close):
            if action.read:
                action.response.read()
            action.response.close()
            return None
        try:
            return self._http.send(action.request, stream=action.stream)
        except httpx.TransportError as exc:
            return exc

    def call(self, call: Call[T]) -> T:
        """Send one typed ``Call`` (retried per the options) and read its typed answer; the
        building block ``Session`` methods share with the client's own."""
        return _read(self._exchange(call), call)

    def stream_text(self, call: Call[Any]) -> TextStream:
        """Send ``call`` (a streamed generation) and read its server-sent events as a ``TextStream``."""
        r = self._exchange(call, stream=True)

        def events() -> Iterator[tuple[str, str]]:
            sse = SSE()
            try:
                for line in itertools.chain(r.iter_lines(), [""]):
                    if (out := sse.feed(line)) is not None:
                        yield out
            except httpx.TransportError as exc:
                raise _broken(call, exc) from exc

        return TextStream(events(), r.close)

    def export_chunks(self) -> Iterator[bytes]:
        call = Calls.audit_export()
        r = self._exchange(call, stream=True)
        try:
            yield from r.iter_bytes()
        except httpx.TransportError as exc:
            raise _broken(call, exc) from exc
        finally:
            r.close()


# --- the asyncio client -----------------------------------------------------------
class AsyncSession:
    """``Session`` for ``AsyncClient``: the same methods, awaited."""

    def __init__(self, client: AsyncClient, id: str) -> None:  # noqa: A002
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r})"

    async def info(self) -> m.SessionOut:
        return await self.client.call(Calls.get_session(self.id))

    async def ledger(self) -> list[m.SegmentOut]:
        return (await self.info()).segments

    async def fingerprint(self) -> str:
        return (await self.info()).fingerprint

    async def append(self, role: str, content: str) -> m.SegmentOut:
        return await self.client.call(Calls.append(self.id, role, content))

    async def admit(self, tool: str, content: str | bytes, *, media_type: str = "text/plain",
                    tags: Sequence[str] = (), source: str | None = None) -> m.AdmissionOut:
        return await self.client.call(Calls.admit(self.id, tool_body(tool, content, media_type, tags, source)))

    async def evict(self, segment_id: str, mode: str | None = None, *, reason: str = "manual") -> m.EvictionOut:
        return await self.client.call(Calls.evict(self.id, segment_id, mode, reason))

    async def authorize_tool_call(self, name: str, arguments: dict[str, Any] | str | None = None, *,
                                  tool: Mapping[str, Any] | None = None) -> m.ToolCallDecisionOut:
        return await self.client.call(Calls.authorize_tool_call(self.id, name, arguments, tool))

    async def evict_refs(self, refs: Sequence[str], *, drop_generated: bool = True,
                         reason: str = "tool_call") -> m.RefsEvictedOut:
        return await self.client.call(Calls.evict_refs(self.id, refs, drop_generated, reason))

    async def materialise(self, refs: Iterable[str] = (), exclude: Iterable[str] = (),
                          budget_tokens: int | None = None, *, model_id: str | None = None,
                          tokenizer_id: str | None = None) -> m.MaterialiseOut:
        return await self.client.call(Calls.materialise(
            self.id, working_set(refs, exclude, budget_tokens, model_id, tokenizer_id)))

    async def generate(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                       top_p: float = 1.0, seed: int | None = None) -> m.GenerateOut:
        body = sampling(max_tokens, min_tokens, temperature, top_p, seed, False)
        return await self.client.call(Calls.generate(self.id, body))

    async def stream(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                     top_p: float = 1.0, seed: int | None = None) -> AsyncTextStream:
        body = sampling(max_tokens, min_tokens, temperature, top_p, seed, True)
        return await self.client.stream_text(Calls.generate(self.id, body))

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

    async def _exchange(self, call: Call[Any], stream: bool = False) -> httpx.Response:
        plan = _Plan(self._http, call, stream, self._opt)
        step = plan.next(None)
        while not isinstance(step, httpx.Response):
            step = plan.next(await self._do(step))
        return step

    async def _do(self, action: Action) -> Reply:
        if isinstance(action, _Sleep):
            await self._opt.sleep(action.seconds)
            return None
        if isinstance(action, _Close):
            if action.read:
                await action.response.aread()
            await action.response.aclose()
            return None
        try:
            return await self._http.send(action.request, stream=action.stream)
        except httpx.TransportError as exc:
            return exc

    async def call(self, call: Call[T]) -> T:
        """Send one typed ``Call`` (retried per the options) and read its typed answer; the
        building block ``AsyncSession`` methods share with the client's own."""
        return _read(await self._exchange(call), call)

    async def stream_text(self, call: Call[Any]) -> AsyncTextStream:
        """Send ``call`` (a streamed generation) and read its events as an ``AsyncTextStream``."""
        r = await self._exchange(call, stream=True)

        async def events() -> AsyncIterator[tuple[str, str]]:
            sse = SSE()
            try:
                async for line in r.aiter_lines():
                    if (out := sse.feed(line)) is not None:
                        yield out
                if (out := sse.feed("")) is not None:
                    yield out
            except httpx.TransportError as exc:
                raise _broken(call, exc) from exc

        return AsyncTextStream(events(), r.aclose)

    async def export_chunks(self) -> AsyncIterator[bytes]:
        call = Calls.audit_export()
        r = await self._exchange(call, stream=True)
        try:
            async for chunk in r.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise _broken(call, exc) from exc
        finally:
            await r.aclose()

    async def health(self) -> dict[str, Any]:
        return await self.call(Calls.health())

    async def create_session(self, id: str | None = None) -> AsyncSession:  # noqa: A002
        return AsyncSession(self, (await self.call(Calls.create_session(id))).id)

    def session(self, id: str) -> AsyncSession:  # noqa: A002
        return AsyncSession(self, id)

    async def get_session(self, id: str) -> m.SessionOut:  # noqa: A002
        return await self.call(Calls.get_session(id))

    async def sessions(self) -> list[str]:
        return await self.call(Calls.sessions())

    async def forget(self, ref: str, reason: str | None = None) -> m.ForgetReceipt:
        return await self.call(Calls.forget(ref, reason))

    async def forget_status(self, request_id: str) -> m.ForgetStatus:
        return await self.call(Calls.forget_status(request_id))

    async def quarantine(self, ref: str, reason: str) -> m.QuarantineOut:
        return await self.call(Calls.quarantine(ref, reason))

    async def held_tool_calls(self, state: str = "pending", limit: int = 100) -> m.HeldCallList:
        return await self.call(Calls.held_tool_calls(state, limit))

    async def held_tool_call(self, call_id: str) -> m.HeldCallOut:
        return await self.call(Calls.held_tool_call(call_id))

    async def approve_tool_call(self, call_id: str) -> m.ToolCallApprovalOut:
        return await self.call(Calls.decide_tool_call(call_id, True))

    async def reject_tool_call(self, call_id: str) -> m.ToolCallApprovalOut:
        return await self.call(Calls.decide_tool_call(call_id, False))

    async def ref_content(self, ref: str) -> bytes:
        return await self.call(Calls.ref_content(ref))

    async def ref_head(self, ref: str) -> RefInfo:
        return await self.call(Calls.ref_head(ref))

    async def audit_entries(self, start: int = 0, limit: int = 100) -> m.EntriesOut:
        return await self.call(Calls.audit_entries(start, limit))

    async def iter_audit_entries(self, start: int = 0, page: int = 500) -> AsyncIterator[m.EntryOut]:
        cursor: int | None = start
        while cursor is not None:
            out = await self.audit_entries(cursor, page)
            for e in out.entries:
                yield e
            cursor = out.next_start

    async def audit_checkpoint(self) -> m.CheckpointOut:
        return await self.call(Calls.audit_checkpoint())

    async def audit_inclusion(self, index: int) -> m.InclusionOut:
        return await self.call(Calls.audit_inclusion(index))

    async def audit_inclusion_tlog(self, index: int) -> str:
        return await self.call(Calls.audit_inclusion_tlog(index))

    async def audit_consistency(self, first: int, second: int | None = None) -> dict[str, Any]:
        return await self.call(Calls.audit_consistency(first, second))

    async def iter_audit_export(self) -> AsyncIterator[dict[str, Any]]:
        lines = Lines()
        async for chunk in self.export_chunks():
            for line in lines.feed(chunk):
                yield json.loads(line)
        for line in lines.end():
            yield json.loads(line)

    async def verify_receipt(self, receipt: m.ForgetReceipt | dict[str, Any]) -> m.ReceiptCheckOut:
        return await self.call(Calls.verify_receipt(receipt))
