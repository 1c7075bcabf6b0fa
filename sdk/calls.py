"""The SDK's calls, without I/O: one ``Call`` per API operation, saying what to send (method,
path, body, query) and how to read a 2xx answer. ``Client`` and ``AsyncClient`` send a
``Call`` over HTTP, ``fak.sdk.local()`` hands it to the kernel's operations
(``fak.kernel.operations``, by ``op`` and ``args``); all three read the answer with the same
``parse``, so results are equal across modes."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from fak.sdk import models as m

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call: what to send and how to read a 2xx answer. ``op`` and ``args`` name the
    operation and its path parameters for the in-process mode."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: dict[str, Any] | None = None
    raw: bool = False  # parse gets the response (body and headers), not its JSON
    op: str = ""
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RefInfo:
    """``HEAD /v1/refs/{ref}``: a ref's size, media type and taint."""

    ref: str
    size: int
    media_type: str
    taint: str


def _model(cls: type[M]) -> Callable[[Any], M]:
    return cls.model_validate


def _ref_info(r: httpx.Response) -> RefInfo:
    return RefInfo(ref=r.headers.get("etag", "").strip('"'), size=int(r.headers.get("content-length") or 0),
                   media_type=r.headers.get("content-type", "").split(";")[0],
                   taint=r.headers.get("x-fak-taint", ""))


def _forget_status(body: dict[str, Any]) -> m.ForgetStatus:
    body = dict(body)
    state = body.pop("state", "completed")
    body.pop("replay", None)  # the receipt says it too (``ForgetReceipt.replay``)
    if state != "completed":
        return m.ForgetStatus(request_id=body["request_id"], ref=body["ref"], state=state)
    receipt = m.ForgetReceipt.model_validate(body)
    return m.ForgetStatus(request_id=receipt.request_id, ref=receipt.ref, state=state, receipt=receipt)


def sampling(max_tokens: int, min_tokens: int, temperature: float, top_p: float, seed: int | None,
             stream: bool) -> dict[str, Any]:
    """A ``GenerateIn`` body."""
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
    """A working-set body for ``materialise``."""
    body: dict[str, Any] = {"refs": list(refs), "exclude": list(exclude)}
    for name, value in (("budget_tokens", budget_tokens), ("model_id", model_id), ("tokenizer_id", tokenizer_id)):
        if value is not None:
            body[name] = value
    return body


def _in_session(op: str, sid: str, tail: str, parse: Callable[[Any], T], body: Any) -> Call[T]:
    return Call("POST", f"/v1/sessions/{sid}/{tail}", parse, json=body, op=op, args={"sid": sid})


class Calls:
    """The routes, as ``Call`` values (one place for paths and bodies)."""

    @staticmethod
    def health() -> Call[dict[str, Any]]:
        return Call("GET", "/healthz", dict, op="health")

    @staticmethod
    def create_session(sid: str | None) -> Call[m.SessionOut]:
        return Call("POST", "/v1/sessions", _model(m.SessionOut), json={"id": sid} if sid is not None else {},
                    op="create_session")

    @staticmethod
    def sessions() -> Call[list[str]]:
        return Call("GET", "/v1/sessions", lambda b: m.SessionList.model_validate(b).sessions, op="sessions")

    @staticmethod
    def get_session(sid: str) -> Call[m.SessionOut]:
        return Call("GET", f"/v1/sessions/{sid}", _model(m.SessionOut), op="get_session", args={"sid": sid})

    @staticmethod
    def append(sid: str, role: str, content: str) -> Call[m.SegmentOut]:
        return _in_session("append", sid, "messages", _model(m.SegmentOut), {"role": role, "content": content})

    @staticmethod
    def admit(sid: str, body: dict[str, Any]) -> Call[m.AdmissionOut]:
        return _in_session("admit", sid, "tool-results", _model(m.AdmissionOut), body)

    @staticmethod
    def evict(sid: str, segment_id: str, mode: str | None, reason: str) -> Call[m.EvictionOut]:
        body: dict[str, Any] = {"segment_id": segment_id, "reason": reason}
        if mode is not None:
            body["mode"] = mode
        return _in_session("evict", sid, "evict", _model(m.EvictionOut), body)

    @staticmethod
    def authorize_tool_call(sid: str, name: str, arguments: Any,
                            tool: Mapping[str, Any] | None = None) -> Call[m.ToolCallDecisionOut]:
        body: dict[str, Any] = {"name": name, "arguments": arguments}
        if tool is not None:
            body["tool"] = dict(tool)
        return _in_session("authorize_tool_call", sid, "tool-calls/authorize", _model(m.ToolCallDecisionOut), body)

    @staticmethod
    def evict_refs(sid: str, refs: Sequence[str], drop_generated: bool, reason: str) -> Call[m.RefsEvictedOut]:
        return _in_session("evict_refs", sid, "evict-refs", _model(m.RefsEvictedOut),
                           {"refs": list(refs), "drop_generated": drop_generated, "reason": reason})

    @staticmethod
    def materialise(sid: str, body: dict[str, Any]) -> Call[m.MaterialiseOut]:
        return _in_session("materialise", sid, "materialise", _model(m.MaterialiseOut), body)

    @staticmethod
    def generate(sid: str, body: dict[str, Any]) -> Call[m.GenerateOut]:
        """A whole turn, or (``body["stream"]``) the server-sent events a ``TextStream`` reads."""
        return _in_session("generate", sid, "generate", _model(m.GenerateOut), body)

    @staticmethod
    def forget(ref: str, reason: str | None) -> Call[m.ForgetReceipt]:
        body = {"ref": ref} | ({"reason": reason} if reason is not None else {})
        return Call("POST", "/v1/forget", _model(m.ForgetReceipt), json=body, op="forget")

    @staticmethod
    def forget_status(request_id: str) -> Call[m.ForgetStatus]:
        return Call("GET", f"/v1/forget/{request_id}", _forget_status, op="forget_status",
                    args={"request_id": request_id})

    @staticmethod
    def quarantine(ref: str, reason: str) -> Call[m.QuarantineOut]:
        return Call("POST", "/v1/quarantine", _model(m.QuarantineOut), json={"ref": ref, "reason": reason},
                    op="quarantine")

    @staticmethod
    def decide_tool_call(call_id: str, approve: bool) -> Call[m.ToolCallApprovalOut]:
        """A person's decision on a call fak held (CONFIRM) at the OpenAI door."""
        verb = "approve" if approve else "reject"
        return Call("POST", f"/v1/tool-calls/{call_id}/{verb}", _model(m.ToolCallApprovalOut),
                    op="decide_tool_call", args={"call_id": call_id, "approve": approve})

    @staticmethod
    def held_tool_calls(state: str = "pending", limit: int = 100) -> Call[m.HeldCallList]:
        """The tenant's calls held for a person (an approver's queue; approver or admin key)."""
        return Call("GET", "/v1/tool-calls", _model(m.HeldCallList), params={"state": state, "limit": limit},
                    op="held_tool_calls")

    @staticmethod
    def held_tool_call(call_id: str) -> Call[m.HeldCallOut]:
        return Call("GET", f"/v1/tool-calls/{call_id}", _model(m.HeldCallOut), op="held_tool_call",
                    args={"call_id": call_id})

    @staticmethod
    def ref_content(ref: str) -> Call[bytes]:
        return Call("GET", f"/v1/refs/{ref}", lambda r: r.content, raw=True, op="ref_content", args={"ref": ref})

    @staticmethod
    def ref_head(ref: str) -> Call[RefInfo]:
        return Call("HEAD", f"/v1/refs/{ref}", _ref_info, raw=True, op="ref_head", args={"ref": ref})

    @staticmethod
    def audit_entries(start: int, limit: int) -> Call[m.EntriesOut]:
        return Call("GET", "/v1/audit/entries", _model(m.EntriesOut), params={"start": start, "limit": limit},
                    op="audit_entries")

    @staticmethod
    def audit_checkpoint() -> Call[m.CheckpointOut]:
        return Call("GET", "/v1/audit/checkpoint", _model(m.CheckpointOut), op="audit_checkpoint")

    @staticmethod
    def audit_inclusion(index: int) -> Call[m.InclusionOut]:
        return Call("GET", f"/v1/audit/proof/inclusion/{index}", _model(m.InclusionOut), op="audit_inclusion",
                    args={"index": index})

    @staticmethod
    def audit_inclusion_tlog(index: int) -> Call[str]:
        return Call("GET", f"/v1/audit/proof/inclusion/{index}", lambda r: r.text, params={"format": "tlog"},
                    raw=True, op="audit_inclusion", args={"index": index})

    @staticmethod
    def audit_consistency(first: int, second: int | None) -> Call[dict[str, Any]]:
        params = {"first": first} | ({"second": second} if second is not None else {})
        return Call("GET", "/v1/audit/proof/consistency", dict, params=params, op="audit_consistency")

    @staticmethod
    def audit_export() -> Call[bytes]:
        """The tenant's export, streamed as JSON lines (read with ``iter_lines``)."""
        return Call("GET", "/v1/audit/export", bytes, op="audit_export")

    @staticmethod
    def verify_receipt(receipt: m.ForgetReceipt | dict[str, Any]) -> Call[m.ReceiptCheckOut]:
        body = receipt.model_dump(mode="json") if isinstance(receipt, m.ForgetReceipt) else receipt
        return Call("POST", "/v1/audit/receipts/verify", _model(m.ReceiptCheckOut), json=body, op="verify_receipt")


class Lines:
    """JSON lines out of byte chunks cut anywhere (a streamed export)."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        return [x for x in lines if x.strip()]

    def end(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [rest] if rest.strip() else []
