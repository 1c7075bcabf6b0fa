"""``fak.sdk.local()``: the ``Client`` interface over an in-process ``Kernel``, no HTTP.

    from fak.sdk import local

    with local() as fak:                 # Kernel.open(Settings.load()) underneath
        s = fak.create_session()
        a = s.admit("web_search", "...")
        print(a.verdict, s.generate(max_tokens=32).text)

Every method returns the same pydantic result as its HTTP twin (built the way the
API's routes build them), validates its arguments with the API's request models, and
raises ``FakAPIError`` with the problem ``type`` the server would send. Differences,
by nature: there is no API key, so no role checks (the caller acts as the tenant's
admin); ``tenant`` is fixed when the client is made.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, TypeVar

from pydantic import ValidationError

from fak.errors import FakError
from fak.sdk.client import RefInfo, TextStream, tool_body, working_set
from fak.sdk.errors import TYPE_BASE, FakAPIError, invalid_input
from fak.sdk.models import (
    AdmissionOut,
    EvictionOut,
    ForgetReceipt,
    ForgetStatus,
    GenerateOut,
    MaterialiseOut,
    PieceOut,
    QuarantineOut,
    RefsEvictedOut,
    SegmentOut,
    SessionOut,
    ToolCallDecisionOut,
)
from fak.wire import (
    EvictIn,
    EvictRefsIn,
    ForgetIn,
    GenerateIn,
    MessageIn,
    QuarantineIn,
    SessionCreate,
    ToolCallIn,
    ToolResultIn,
)

if TYPE_CHECKING:
    from fak.kernel.agent_session import KernelSession
    from fak.kernel.facade import Kernel
    from fak.sdk.models import CheckpointOut, EntriesOut, EntryOut, InclusionOut, ReceiptCheckOut
    from fak.settings import Settings

T = TypeVar("T")
PRINCIPAL = "sdk-local"


@contextmanager
def _errors() -> Iterator[None]:
    """Kernel errors and invalid arguments as the API would answer them."""
    try:
        yield
    except FakError as exc:
        raise FakAPIError.from_fak_error(exc) from exc
    except ValidationError as exc:
        raise invalid_input(exc) from exc


def _validate(model: type[T], body: dict[str, Any]) -> T:
    with _errors():
        return model.model_validate(body)  # type: ignore[attr-defined]


def _bounded(value: int, name: str, low: int = 0, high: int = 2**63 - 1) -> int:
    """A query parameter checked as the route's ``Query(ge=, le=)`` checks it."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        detail = f"{name}: must be an integer in [{low}, {high}]"
        raise FakAPIError(400, TYPE_BASE + "invalid_input", detail)
    return value


def _digest(ref: str) -> str:
    from fak.cas.digest import parse_digest

    parse_digest(ref)  # invalid_digest (400) before any lookup, as the refs route does
    return ref


def _session_out(ks: KernelSession) -> SessionOut:
    return SessionOut(id=ks.id, tokens=ks.tokens, fingerprint=ks.fingerprint(),
                      segments=[SegmentOut(**x) for x in ks.ledger()])


class LocalSession:
    """The ``Session`` interface over a ``KernelSession``."""

    def __init__(self, client: LocalClient, id: str) -> None:  # noqa: A002
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"LocalSession({self.id!r})"

    @property
    def kernel_session(self) -> KernelSession:
        """The underlying ``KernelSession`` (the kernel's own API, for what the SDK does not wrap)."""
        with _errors():
            return self.client.kernel.session(self.client.tenant, self.id)

    def _run(self, fn: Callable[[KernelSession], T]) -> T:
        with _errors():
            return fn(self.client.kernel.session(self.client.tenant, self.id))

    def info(self) -> SessionOut:
        return self._run(_session_out)

    def ledger(self) -> list[SegmentOut]:
        return self.info().segments

    def fingerprint(self) -> str:
        return self._run(lambda ks: ks.fingerprint())

    def append(self, role: str, content: str) -> SegmentOut:

        body = _validate(MessageIn, {"role": role, "content": content})
        return self._run(lambda ks: SegmentOut(**ks.append(body.role, body.content).summary()))

    def admit(self, tool: str, content: str | bytes, *, media_type: str = "text/plain",
              tags: Sequence[str] = (), source: str | None = None) -> AdmissionOut:
        from fak.api.routes.sessions import admission_out
        from fak.errors import InvalidInput

        body = _validate(ToolResultIn, tool_body(tool, content, media_type, tags, source))

        def run(ks: KernelSession) -> AdmissionOut:
            try:
                data = body.data()
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            return admission_out(ks.admit(body.tool, data, media_type=body.media_type, tags=body.tags,
                                          source=body.source))

        return self._run(run)

    def evict(self, segment_id: str, mode: str | None = None, *, reason: str = "manual") -> EvictionOut:

        body = _validate(EvictIn, {"segment_id": segment_id, "mode": mode, "reason": reason})

        def run(ks: KernelSession) -> EvictionOut:
            r = ks.evict(body.segment_id, body.mode, reason=body.reason)
            return EvictionOut(segment_id=r.segment_id, ref=r.ref, mode=r.mode.value, exactness=r.exactness,
                               rows_removed=r.rows_removed, rows_replayed=r.rows_replayed, seconds=r.seconds,
                               fingerprint=r.fingerprint)

        return self._run(run)

    def authorize_tool_call(self, name: str, arguments: dict[str, Any] | str | None = None) -> ToolCallDecisionOut:
        from fak.api.routes.sessions import decision_out

        body = _validate(ToolCallIn, {"name": name, "arguments": arguments})
        return self._run(lambda ks: decision_out(ks.authorize_tool_call(body.name, body.arguments,
                                                                        principal=PRINCIPAL)))

    def evict_refs(self, refs: Sequence[str], *, drop_generated: bool = True,
                   reason: str = "tool_call") -> RefsEvictedOut:

        body = _validate(EvictRefsIn, {"refs": list(refs), "drop_generated": drop_generated, "reason": reason})

        def run(ks: KernelSession) -> RefsEvictedOut:
            r = ks.evict_refs(body.refs, drop_generated=body.drop_generated, reason=body.reason)
            return RefsEvictedOut(segment_ids=r.segment_ids, exactness=r.exactness, fingerprint=r.fingerprint,
                                  audit_indexes=r.audit_indexes)

        return self._run(run)

    def materialise(self, refs: Iterable[str] = (), exclude: Iterable[str] = (), budget_tokens: int | None = None,
                    *, model_id: str | None = None, tokenizer_id: str | None = None) -> MaterialiseOut:
        body = working_set(refs, exclude, budget_tokens, model_id, tokenizer_id)

        def run(ks: KernelSession) -> MaterialiseOut:
            r = ks.materialise(body)
            return MaterialiseOut(pieces=[PieceOut(**p.as_dict()) for p in r.pieces], evicted=r.evicted,
                                  segments=[SegmentOut(**x) for x in r.ledger], context_tokens=r.context_tokens,
                                  fingerprint=r.fingerprint, audit_index=r.audit_index)

        return self._run(run)

    @staticmethod
    def _params(max_tokens: int, min_tokens: int, temperature: float, top_p: float,
                seed: int | None) -> dict[str, Any]:

        b = _validate(GenerateIn, {"max_tokens": max_tokens, "min_tokens": min_tokens, "temperature": temperature,
                                   "top_p": top_p, "seed": seed})
        return {"max_tokens": b.max_tokens, "min_tokens": min(b.min_tokens, b.max_tokens),
                "temperature": b.temperature, "top_p": b.top_p, "seed": b.seed}

    def generate(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None) -> GenerateOut:
        params = self._params(max_tokens, min_tokens, temperature, top_p, seed)

        def run(ks: KernelSession) -> GenerateOut:
            ids = list(ks.generate(**params))
            tok = ks.kernel.tokenizer
            text = tok.decode_turn(ids)
            last = ks.ledger()[-1] if ids else None
            return GenerateOut(text=text, tokens=ids, segment=SegmentOut(**last) if last else None,
                               fingerprint=ks.fingerprint())

        return self._run(run)

    def stream(self, max_tokens: int = 128, *, min_tokens: int = 0, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None) -> TextStream:
        """The same events the server streams, decoded the same way (``TextDecoder``).
        The session stays locked until the stream ends or is closed (closing rolls back)."""
        from fak.api.routes.sessions import TextDecoder

        params = self._params(max_tokens, min_tokens, temperature, top_p, seed)
        ks = self._run(lambda ks: ks)
        with _errors():
            tokens = ks.generate(**params)
            first = next(tokens, None)  # errors (busy, bad parameters) before any piece, as the server does

        def events() -> Iterator[tuple[str, dict[str, Any]]]:
            decoder = TextDecoder(ks.kernel.tokenizer)
            token = first
            with _errors():
                while token is not None:
                    yield "message", {"token": token, "text": decoder.push(token)}
                    token = next(tokens, None)
                yield "done", {"segment": ks.ledger()[-1], "fingerprint": ks.fingerprint()}

        gen = events()

        def close() -> None:
            gen.close()
            tokens.close()  # before exhaustion: the kernel rolls the partial turn back

        return TextStream(gen, close)

    def chat(self, text: str, **sampling: Any) -> str:
        self.append("user", text)
        return self.generate(**sampling).text


class LocalClient:
    """The ``Client`` interface over a ``Kernel`` in this process (see ``local()``)."""

    def __init__(self, kernel: Kernel, tenant: str = "local", *, owns_kernel: bool = False) -> None:
        from fak.types import check_tenant

        with _errors():
            self.tenant = check_tenant(tenant)
        self.kernel = kernel
        self._owns = owns_kernel

    def close(self) -> None:
        """Close the kernel if ``local()`` opened it."""
        if self._owns:
            self.kernel.close()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict:
        return {"status": "ok"}

    def create_session(self, id: str | None = None) -> LocalSession:  # noqa: A002

        body = _validate(SessionCreate, {"id": id})
        with _errors():
            ks = self.kernel.create_session(self.tenant, body.id)
        return LocalSession(self, ks.id)

    def session(self, id: str) -> LocalSession:  # noqa: A002
        return LocalSession(self, id)

    def get_session(self, id: str) -> SessionOut:  # noqa: A002
        return LocalSession(self, id).info()

    def sessions(self) -> list[str]:
        with _errors():
            return self.kernel.sessions(self.tenant)

    def forget(self, ref: str, reason: str | None = None) -> ForgetReceipt:

        body = _validate(ForgetIn, {"ref": ref, "reason": reason})
        with _errors():
            return self.kernel.forget(self.tenant, body.ref, requested_by=PRINCIPAL, reason=body.reason)

    def forget_status(self, request_id: str) -> ForgetStatus:

        with _errors():
            st = self.kernel.forget_status(self.tenant, request_id)
        return ForgetStatus(request_id=st.request_id, ref=st.ref, state=st.state, receipt=st.receipt)

    def quarantine(self, ref: str, reason: str) -> QuarantineOut:

        body = _validate(QuarantineIn, {"ref": ref, "reason": reason})
        with _errors():
            r = self.kernel.quarantine(self.tenant, body.ref, reason=body.reason, principal=PRINCIPAL)
        return QuarantineOut(ref=r.ref, units=r.units, mode=r.mode, audit_index=r.audit_index, pending=r.pending)

    # refs
    def ref_content(self, ref: str) -> bytes:
        with _errors():
            return self.kernel.store.get(_digest(ref), self.tenant)

    def ref_head(self, ref: str) -> RefInfo:
        from fak.errors import NotFound

        with _errors():
            head = self.kernel.store.head(_digest(ref), self.tenant)
            if head is None:
                raise NotFound(f"no ref {ref}")
            if head.state != "live":
                from fak.cas.errors import Forgotten

                raise Forgotten(f"ref {ref} was forgotten: its key and ciphertext were destroyed")
        return RefInfo(ref=head.digest, size=head.size, media_type=head.media_type, taint=head.taint)

    # audit: the API's own route functions, called with this tenant as an admin principal
    def _audit(self, name: str, **kw: Any) -> Any:
        from fak.api.keys import Principal, Role
        from fak.api.routes import audit

        with _errors():
            return getattr(audit, name)(**kw, who=Principal(PRINCIPAL, self.tenant, Role.ADMIN), k=self.kernel)

    def audit_entries(self, start: int = 0, limit: int = 100) -> EntriesOut:
        return self._audit("entries", start=_bounded(start, "start"), limit=_bounded(limit, "limit", 1, 1000))

    def iter_audit_entries(self, start: int = 0, page: int = 500) -> Iterator[EntryOut]:
        cursor: int | None = start
        while cursor is not None:
            out = self.audit_entries(cursor, page)
            yield from out.entries
            cursor = out.next_start

    def audit_checkpoint(self) -> CheckpointOut:
        return self._audit("checkpoint")

    def audit_inclusion(self, index: int) -> InclusionOut:
        return self._audit("inclusion", index=_bounded(index, "index"), format="json")

    def audit_inclusion_tlog(self, index: int) -> str:
        return self._audit("inclusion", index=_bounded(index, "index"), format="tlog").body.decode()

    def audit_consistency(self, first: int, second: int | None = None) -> dict:
        return self._audit("consistency", first=_bounded(first, "first"),
                           second=None if second is None else _bounded(second, "second"))

    def _export_chunks(self) -> Iterator[bytes]:
        """The bytes ``GET /v1/audit/export`` streams (the route's own line writer)."""
        from fak.api.routes import audit

        with _errors():
            yield from audit.export_lines(self.kernel, self.tenant)

    def iter_audit_export(self) -> Iterator[dict]:
        import json

        for chunk in self._export_chunks():
            for line in chunk.splitlines():
                if line:
                    yield json.loads(line)

    def audit_export(self, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        from fak.sdk.client import _sink

        n = 0
        with _sink(dest) as out:
            for chunk in self._export_chunks():
                out.write(chunk)
                n += len(chunk)
        return n

    def verify_receipt(self, receipt: ForgetReceipt | dict[str, Any]) -> ReceiptCheckOut:
        body = receipt.model_dump(mode="json") if isinstance(receipt, ForgetReceipt) else receipt
        return self._audit("verify_receipt", receipt=body)


def local(settings: Settings | None = None, *, kernel: Kernel | None = None, tenant: str = "local",
          model: Any = None) -> LocalClient:
    """The SDK over an in-process Kernel: ``kernel`` if given (left open on ``close``),
    else ``Kernel.open(settings or Settings.load(), model=model)`` (closed on ``close``)."""
    if kernel is not None:
        return LocalClient(kernel, tenant)
    from fak.kernel.facade import Kernel
    from fak.settings import Settings

    with _errors():
        k = Kernel.open(settings or Settings.load(), model=model, progress=None)
    try:
        return LocalClient(k, tenant, owns_kernel=True)
    except BaseException:
        k.close()
        raise
