"""``fak.sdk.local()``: the ``Client`` interface over an in-process ``Kernel``, no HTTP.

    from fak.sdk import local

    with local() as fak:                 # Kernel.open(Settings.load()) underneath
        s = fak.create_session()
        a = s.admit("web_search", "...")
        print(a.verdict, s.generate(max_tokens=32).text)

The methods are the HTTP client's own (``Session``, ``BlockingAPI``); only the transport
differs: each ``Call`` goes to the kernel operation the route would call
(``fak.kernel.operations``), its body validated by the same wire model, and the answer is
read by the same ``parse``, so results compare equal across modes. Errors are
``FakAPIError`` with the problem ``type`` the server would send. The SDK never imports the
server. There is no API key: the client acts for one ``tenant`` with the ``rights`` it is
given (all of them by default, as the owner of the kernel) under the audit name
``principal``. Rights narrow what the SDK's calls may do (an agent's loop given ``read`` and
``agent`` cannot forget); they are no boundary against code in the same process, which holds
the ``Kernel`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from fak.errors import FakError, InvalidInput
from fak.kernel import operations as ops
from fak.kernel.openai import chat as openai_chat
from fak.kernel.operations import MAX_INDEX, MAX_LIMIT
from fak.kernel.session.caller import Caller, Right
from fak.sdk.calls import Call
from fak.sdk.client import BlockingAPI, Session
from fak.sdk.errors import TYPE_BASE, FakAPIError, invalid_input
from fak.sdk.streams import TextStream
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
    from fak.kernel.facade import Kernel
    from fak.kernel.session.kernel_session import KernelSession
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


def _bounded(value: Any, name: str, low: int = 0, high: int = MAX_INDEX) -> int:
    """A query or path parameter checked as the route's ``Query(ge=, le=)`` checks it."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FakAPIError(400, TYPE_BASE + "invalid_input", f"{name}: must be an integer in [{low}, {high}]")
    return value


def _ref(k: Kernel, c: Caller, args: dict[str, Any], content: bool) -> httpx.Response:
    """``GET``/``HEAD /v1/refs/{ref}`` as the route answers it (headers, and the bytes for a GET)."""
    ref = ops.find_ref(k, c, args["ref"])
    if content:
        return httpx.Response(200, headers=ops.ref_headers(ref), content=ops.ref_content(k, c, ref))
    return httpx.Response(200, headers=ops.ref_headers(ref) | {"Content-Length": str(ref.size)})


def _inclusion(k: Kernel, c: Caller, args: dict[str, Any], body: Any, q: dict[str, Any]) -> Any:
    out = ops.audit_inclusion(k, c, _bounded(args["index"], "index"), q.get("format", "json"))
    return httpx.Response(200, text=out) if isinstance(out, str) else out


Op = Callable[["Kernel", Caller, dict[str, Any], Any, dict[str, Any]], Any]
# Each call's operation: (kernel, caller, path args, JSON body, query) -> a wire model, JSON, or a response.
OPS: dict[str, Op] = {
    "health": lambda k, c, a, b, q: {"status": "ok"},
    "create_session": lambda k, c, a, b, q: ops.create_session(k, c, SessionCreate.model_validate(b)),
    "sessions": lambda k, c, a, b, q: ops.list_sessions(k, c),
    "get_session": lambda k, c, a, b, q: ops.get_session(k, c, a["sid"]),
    "append": lambda k, c, a, b, q: ops.append(k, c, a["sid"], MessageIn.model_validate(b)),
    "admit": lambda k, c, a, b, q: ops.admit(k, c, a["sid"], ToolResultIn.model_validate(b)),
    "evict": lambda k, c, a, b, q: ops.evict(k, c, a["sid"], EvictIn.model_validate(b)),
    "authorize_tool_call": lambda k, c, a, b, q: ops.authorize_tool_call(k, c, a["sid"], ToolCallIn.model_validate(b)),
    "evict_refs": lambda k, c, a, b, q: ops.evict_refs(k, c, a["sid"], EvictRefsIn.model_validate(b)),
    "materialise": lambda k, c, a, b, q: ops.materialise(k, c, a["sid"], b),
    "generate": lambda k, c, a, b, q: ops.generate(k, c, a["sid"], GenerateIn.model_validate(b)),
    "forget": lambda k, c, a, b, q: ops.forget(k, c, ForgetIn.model_validate(b)),
    "forget_status": lambda k, c, a, b, q: ops.forget_status(k, c, a["request_id"]),
    "quarantine": lambda k, c, a, b, q: ops.quarantine(k, c, QuarantineIn.model_validate(b)),
    "decide_tool_call": lambda k, c, a, b, q: openai_chat.decide_held_call(k, c, a["call_id"], approve=a["approve"]),
    "held_tool_calls": lambda k, c, a, b, q: openai_chat.held_calls(
        k, c, q["state"], _bounded(q["limit"], "limit", 1, MAX_LIMIT)),
    "held_tool_call": lambda k, c, a, b, q: openai_chat.held_call(k, c, a["call_id"]),
    "ref_content": lambda k, c, a, b, q: _ref(k, c, a, content=True),
    "ref_head": lambda k, c, a, b, q: _ref(k, c, a, content=False),
    "audit_entries": lambda k, c, a, b, q: ops.audit_entries(
        k, c, _bounded(q["start"], "start"), _bounded(q["limit"], "limit", 1, MAX_LIMIT)),
    "audit_checkpoint": lambda k, c, a, b, q: ops.audit_checkpoint(k, c),
    "audit_inclusion": _inclusion,
    "audit_consistency": lambda k, c, a, b, q: ops.audit_consistency(
        k, c, _bounded(q["first"], "first"), None if q.get("second") is None else _bounded(q["second"], "second")),
    "verify_receipt": lambda k, c, a, b, q: ops.verify_receipt(k, c, b),
}


class LocalSession(Session):
    """The ``Session`` interface over a ``KernelSession`` in this process."""

    client: LocalClient

    @property
    def kernel_session(self) -> KernelSession:
        """The underlying ``KernelSession`` (the kernel's own API, for what the SDK does not wrap):
        it can change the session, so it needs the ``agent`` right."""
        with _errors():
            return ops.session(self.client.kernel, self.client.caller, self.id, Right.AGENT)


class LocalClient(BlockingAPI):
    """The ``Client`` interface over a ``Kernel`` in this process (see ``local()``)."""

    session_class = LocalSession

    def __init__(self, kernel: Kernel, tenant: str = "local", *, rights: Collection[Right | str] | None = None,
                 principal: str = PRINCIPAL, owns_kernel: bool = False) -> None:
        from fak.types import check_tenant

        with _errors():
            self.tenant = check_tenant(tenant)
            known = {r.value for r in Right}
            if rights is not None and (unknown := sorted(str(r) for r in rights if str(r) not in known)):
                raise InvalidInput(f"unknown rights {unknown}; rights are {sorted(known)}")
        self.caller = Caller(self.tenant, principal, frozenset(Right) if rights is None
                             else frozenset(Right(r) for r in rights))
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

    def call(self, call: Call[T]) -> T:
        with _errors():
            op = OPS.get(call.op)
            if op is None:  # a streamed call (the audit export) has its own method
                raise InvalidInput(f"{call.op!r} is not a single call in process; use the client's method")
            out = op(self.kernel, self.caller, call.args, call.json, call.params or {})
            if isinstance(out, httpx.Response):
                return call.parse(out)
            return call.parse(out.model_dump(mode="json") if isinstance(out, BaseModel) else out)

    def stream_text(self, call: Call[Any]) -> TextStream:
        """The events the server streams, from the same ``Turn``; the session stays locked until
        the stream ends or is closed (closing early rolls the turn back)."""
        with _errors():
            turn = ops.open_turn(self.kernel, self.caller, call.args["sid"], GenerateIn.model_validate(call.json))

        def events() -> Generator[tuple[str, dict[str, Any]], None, None]:
            with _errors():
                while (event := turn.next_event()) is not None:
                    yield event

        gen = events()

        def close() -> None:
            gen.close()
            turn.close()

        return TextStream(gen, close)

    def export_chunks(self) -> Iterator[bytes]:
        """The bytes ``GET /v1/audit/export`` streams."""
        with _errors():
            yield from ops.audit_export(self.kernel, self.caller)


def local(settings: Settings | None = None, *, kernel: Kernel | None = None, tenant: str = "local",
          model: Any = None, rights: Collection[Right | str] | None = None) -> LocalClient:
    """The SDK over an in-process Kernel: ``kernel`` if given (left open on ``close``),
    else ``Kernel.open(settings or Settings.load(), model=model)`` (closed on ``close``).
    ``rights`` (default: all) limits what the client may do in ``tenant``: ``read``,
    ``agent``, ``audit``, ``admin`` (``fak.kernel.session.caller.Right``)."""
    if kernel is not None:
        return LocalClient(kernel, tenant, rights=rights)
    from fak.kernel.facade import Kernel
    from fak.settings import Settings

    with _errors():
        k = Kernel.open(settings or Settings.load(), model=model, progress=None)
    try:
        return LocalClient(k, tenant, rights=rights, owns_kernel=True)
    except BaseException:
        k.close()
        raise
