"""The MCP gateway (docs/mcp.md, "The MCP gateway"): for clients that run tools themselves
(desktop agents, IDEs, an Agents SDK ``MCPServerStreamableHttp``), ``fak serve`` speaks MCP at
``/mcp`` and proxies the deployment's declared MCP servers (``fak.kernel.mcp``). This module is
the gateway's logic; ``fak.api.mcp_gateway`` is the thin MCP-protocol adapter over it.

Each request runs in a kernel session: the one the client bound (``fak-session``: a session of
the caller's tenant), else one per MCP connection (``connection_session``: created on first use,
deleted when the connection ends or after ``idle_s`` without a request). In that session:

- ``list_tools``: every server's tools as ``McpServers.offer`` gives them (the deployment's
  ``allowed_tools`` and the operator's pins), a name shown plain where no other server offers the
  same one, else ``<label>__<tool>``. Each server's definitions, as listed, are admitted into the
  session as content under ``mcp:<label>`` (through the gate; skipped while a live segment holds
  the same ref): a server whose definitions the gate does not admit offers nothing.
- ``call``: the name is resolved against each server's listing kept from the last ``tools/list``
  (or listed now when it does not resolve there), checked against the pins at use (``resolve``);
  the call is decided by ``KernelSession.authorize_tool_call`` under its governed name
  ``mcp:<label>/<tool>`` (argument provenance over the session's attention; the tool's schema
  classifies it where no rule names it). ALLOW: forwarded, ``McpToolCalled(via="gateway")``
  logged, the result admitted first-hand under ``mcp:<label>/<tool>`` with the server's URL as
  source, and the admitted bytes returned (a result the gate withholds is never returned).
  CONFIRM: not forwarded; held for a person (``HeldCalls``), the same call allowed once approved
  (the session remembers the approval). DENY: never forwarded. An upstream failure is logged as
  ``failed`` and nothing is admitted.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from fak.audit.events import McpToolCalled
from fak.errors import InvalidInput
from fak.kernel.calls.authorize import ToolCallDecision, args_digest, parsed_args
from fak.kernel.calls.held import HeldCall
from fak.kernel.calls.records import findings_out
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.kv.ledger import SegmentState
from fak.kernel.mcp.client import McpError, McpTool
from fak.kernel.mcp.servers import McpServers, definitions_producer, provenance
from fak.kernel.services import Services
from fak.kernel.session.kernel_session import KernelSession
from fak.types import as_id

__all__ = ["SEPARATOR", "GatewayResult", "GatewayTool", "McpGateway", "SessionDoor"]

SEPARATOR = "__"  # <label>__<tool>: a tool name two servers offer
IDLE_S = 30 * 60.0  # an unbound connection's session is deleted after this long without a request
Outcome = Literal["ok", "tool_error", "failed", "held", "denied", "withheld", "unknown_tool"]


class SessionDoor(Protocol):
    """What the gateway needs of the façade (``fak.Kernel``): a tenant's sessions."""

    def session(self, tenant: str, id: str | None = None) -> KernelSession: ...  # noqa: A002

    def create_session(self, tenant: str, id: str | None = None) -> KernelSession: ...  # noqa: A002

    def delete_session(self, tenant: str, id: str) -> None: ...  # noqa: A002


@dataclass(frozen=True)
class GatewayTool:
    """One tool as the gateway lists it: the name the client sees and the server's tool."""

    name: str
    label: str
    tool: McpTool
    source: str

    @property
    def governed(self) -> str:
        """The name its calls are decided, logged and its results admitted under."""
        return provenance(self.label, self.tool.name)

    def spec(self) -> ToolSpec:
        """The tool's definition for the decision (its schema classifies it where no rule names it)."""
        return ToolSpec(self.governed, self.tool.description, self.tool.input_schema, False)

    def listed(self) -> dict[str, Any]:
        """The definition as the client is shown it (and as it is admitted)."""
        return {"name": self.name, "description": self.tool.description, "inputSchema": self.tool.input_schema}


@dataclass(frozen=True)
class GatewayResult:
    """What a ``tools/call`` answers: ``text`` (the admitted bytes, or fak's explanation when the
    result is an error), whether it is an error, and what fak decided."""

    text: str
    is_error: bool
    outcome: Outcome
    tool: str  # the governed name (``mcp:<label>/<tool>``), or the name asked for when unknown
    verdict: str | None = None  # the call's decision: ALLOW | CONFIRM | DENY
    rule_id: str | None = None
    call_id: str | None = None  # a held call's id is the one a person approves
    decision_index: int | None = None
    ref: str | None = None  # the result's ref, when it was admitted
    admission: str | None = None  # the gate's verdict on the result
    admission_rule: str | None = None
    media_type: str = "text/plain"

    def meta(self) -> dict[str, Any]:
        """fak's part of the MCP result's ``_meta``."""
        out = {"verdict": self.verdict, "rule_id": self.rule_id, "call_id": self.call_id, "outcome": self.outcome,
               "decision_index": self.decision_index, "ref": self.ref, "admission": self.admission,
               "admission_rule": self.admission_rule, "tool": self.tool}
        return {"fak.dev/" + k: v for k, v in out.items() if v is not None}


@dataclass
class _Connection:
    session_id: str
    used: float


class McpGateway:
    """The gateway's kernel half; thread-safe (the adapter runs each request in a worker thread)."""

    def __init__(self, services: Services, sessions: SessionDoor, *, idle_s: float = IDLE_S) -> None:
        self.services = services
        self._sessions = sessions
        self.idle_s = idle_s
        self._connections: dict[tuple[str, str], _Connection] = {}
        self._listings: dict[str, tuple[McpTool, ...]] = {}  # label -> its last listing (before any filter)
        self._lock = threading.Lock()

    @property
    def servers(self) -> McpServers | None:
        return self.services.mcp

    # --- sessions ---------------------------------------------------------------------------
    def bound(self, tenant: str, session_id: str) -> KernelSession:
        """The session a client bound its MCP session to: the tenant's own (another tenant's id
        answers as an unknown one does, ``NotFound``)."""
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInput("fak-session names a session id")
        return self._sessions.session(tenant, session_id)

    def connection_session(self, tenant: str, connection: str) -> KernelSession:
        """The session of an unbound MCP connection (``connection``: the transport's session id,
        or what stands for the connection), created on its first use."""
        with self._lock:
            held = self._connections.get((tenant, connection))
            if held is None:
                ks = self._sessions.create_session(tenant)
                self._connections[(tenant, connection)] = _Connection(ks.id, time.monotonic())
                return ks
            held.used = time.monotonic()
            session_id = held.session_id
        return self._sessions.session(tenant, session_id)

    def connection_sessions(self) -> dict[tuple[str, str], str]:
        """The unbound connections' sessions now: (tenant, connection) to session id."""
        with self._lock:
            return {k: c.session_id for k, c in self._connections.items()}

    def end(self, tenant: str, connection: str) -> bool:
        """The connection ended: its session is deleted (whether there was one)."""
        with self._lock:
            held = self._connections.pop((tenant, connection), None)
        if held is None:
            return False
        self._delete(tenant, held.session_id)
        return True

    def sweep(self, now: float | None = None) -> int:
        """Delete the sessions of connections idle for ``idle_s``; how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [(k, c) for k, c in self._connections.items() if now - c.used >= self.idle_s]
            for k, _ in idle:
                del self._connections[k]
        for (tenant, _), c in idle:
            self._delete(tenant, c.session_id)
        return len(idle)

    def close(self) -> None:
        """Delete every unbound connection's session (the server stops)."""
        self.sweep(float("inf"))

    def _delete(self, tenant: str, session_id: str) -> None:
        try:
            self._sessions.delete_session(tenant, session_id)
        except Exception:  # noqa: BLE001 - already gone (a person deleted it), or the kernel is closing
            return

    # --- tools/list -------------------------------------------------------------------------
    def tools(self, *, fresh: bool = True) -> list[GatewayTool]:
        """Every declared server's offered tools, named for the client (a server that cannot be
        listed now offers nothing). ``fresh``: each server listed now (and its listing kept);
        otherwise the listing kept from the last one (a server never listed, or whose last
        listing failed, is listed now). Either way checked against the pins as they are now."""
        servers = self.servers
        if servers is None:
            return []
        offered: list[tuple[str, str, McpTool]] = []
        for label in servers.labels():
            with self._lock:
                listing = None if fresh else self._listings.get(label)
            try:
                if listing is None:
                    listing = tuple(servers.tools(label))
                    with self._lock:
                        self._listings[label] = listing
                offer = servers.offer(label, listing=listing)
            except McpError:
                with self._lock:
                    self._listings.pop(label, None)
                continue
            offered += [(label, offer.source, t) for t in offer.offered]
        counts = Counter(t.name for _, _, t in offered)
        return [GatewayTool(t.name if counts[t.name] == 1 else f"{label}{SEPARATOR}{t.name}", label, t, source)
                for label, source, t in offered]

    def list_tools(self, ks: KernelSession) -> list[GatewayTool]:
        """The tools the client is shown, each server's definitions admitted into ``ks`` first;
        a server whose definitions the gate does not admit offers none. Every server is listed
        now: the listing the calls resolve against is this one."""
        tools = self.tools(fresh=True)
        shown: list[GatewayTool] = []
        for label in sorted({t.label for t in tools}):
            mine = [t for t in tools if t.label == label]
            if self._definitions_admitted(ks, label, mine):
                shown += mine
        return shown

    def _definitions_admitted(self, ks: KernelSession, label: str, tools: Sequence[GatewayTool]) -> bool:
        data = json.dumps([t.listed() for t in tools], ensure_ascii=False, sort_keys=True).encode("utf-8")
        ref = self.services.store.digest_of(data, ks.tenant)
        if any(x.ref == ref and x.state is SegmentState.LIVE for x in ks.segments()):
            return True
        a = ks.admit(definitions_producer(label), data, media_type="application/json", source=tools[0].source)
        return a.admitted

    def resolve(self, name: str) -> GatewayTool | None:
        """The offered tool a client's ``name`` calls (None: no offered tool has that name).

        Resolved against the servers' kept listings (the last ``tools/list``'s), each checked
        against the pins as they are now; a name that does not resolve there (a tool the kept
        listing lacks, or whose kept definition no longer matches its pin) is resolved once more
        against a listing made now. So a call runs only a tool whose definition, as last listed
        to a client, is the one an operator pinned: a description changed on the server is
        withheld by the next ``tools/list`` and its calls refused from then on, and a pin
        changed or removed by an operator refuses calls at once."""
        found = next((t for t in self.tools(fresh=False) if t.name == name), None)
        return found if found is not None else next((t for t in self.tools(fresh=True) if t.name == name), None)

    # --- tools/call -------------------------------------------------------------------------
    def call(self, ks: KernelSession, name: str, arguments: Mapping[str, Any] | None, principal: str) -> GatewayResult:
        """Decide, and forward only what the policy allows (see the module's docstring)."""
        tool = self.resolve(name) if isinstance(name, str) else None
        if tool is None:
            return GatewayResult(f"fak: no tool named {str(name)[:128]!r} is offered here (an unknown tool, or one "
                                 "an operator has not approved)", True, "unknown_tool", str(name)[:128])
        args = parsed_args(dict(arguments or {}))
        decision = ks.authorize_tool_call(tool.governed, args, principal=principal, tool=tool.spec())
        if decision.verdict == "DENY":
            return GatewayResult(
                f"fak refused the call to {tool.name}: policy rule {decision.rule_id or 'unlisted'} denies it"
                + (f" ({len(decision.offending)} ref(s) in the session involved)." if decision.offending else "."),
                True, "denied", tool.governed, decision.verdict, decision.rule_id, None, decision.audit_index)
        if decision.verdict == "CONFIRM":
            return self._hold(ks, tool, args, decision, principal)
        return self._forward(ks, tool, args, decision)

    def _hold(self, ks: KernelSession, tool: GatewayTool, args: Any, decision: ToolCallDecision,
              principal: str) -> GatewayResult:
        holds = self.services.holds
        call_id = holds.new_id(ks.tenant, tool.governed, args, held=True)
        holds.hold(HeldCall(tenant=ks.tenant, session_id=ks.id, call_id=call_id, tool=tool.governed, arguments=args,
                            rule_id=decision.rule_id, offending=decision.offending,
                            decision_index=decision.audit_index, created=time.time(),
                            approval_key=ks.approval_key(tool.governed, args, decision), producer=principal,
                            findings=tuple(findings_out(decision)), refs=tuple(sorted(ks.refs()))))
        return GatewayResult(
            f"fak held the call to {tool.name} for a person's approval (policy rule {decision.rule_id or 'unlisted'}); "
            f"it did not run. Held call {call_id}: a person approves it with POST /v1/tool-calls/{call_id}/approve, "
            "then the same call may be made again.",
            True, "held", tool.governed, decision.verdict, decision.rule_id, call_id, decision.audit_index)

    def _forward(self, ks: KernelSession, tool: GatewayTool, args: Any, decision: ToolCallDecision) -> GatewayResult:
        servers = self.servers
        assert servers is not None  # resolve found the tool among its servers
        call_id = self.services.holds.new_id(ks.tenant, tool.governed, args, held=False)
        digest = args_digest(self.services.keys.tool_args_key(), args)

        def called(outcome: Literal["ok", "tool_error", "failed"]) -> Future[int]:
            # submitted, not awaited: its commit overlaps the admission, and the reply waits for it
            return self.services.audit.submit(McpToolCalled(
                tenant=ks.tenant, session_id=as_id(ks.id), server=as_id(tool.label), tool=as_id(tool.governed),
                call_id=as_id(call_id), args_digest=digest, decision_index=decision.audit_index, outcome=outcome,
                via="gateway"))

        base = GatewayResult("", True, "failed", tool.governed, decision.verdict, decision.rule_id, call_id,
                             decision.audit_index)
        try:
            result = servers.call(tool.label, tool.tool.name, args if isinstance(args, dict) else {})
        except McpError as exc:
            called("failed").result()
            return replace(base, text=f"fak: the call to {tool.name} failed upstream: {exc}")
        logged = called("tool_error" if result.is_error else "ok")
        try:
            a = ks.admit(tool.governed, result.data, media_type=result.media_type, source=tool.source)
        finally:
            logged.result()  # the call is in the log before anything of it is answered
        if not a.admitted or a.admitted_ref is None:
            return replace(base, outcome="withheld", admission=a.verdict.kind.value, admission_rule=a.verdict.rule_id,
                           text=f"fak: the result of {tool.name} was withheld by policy (verdict "
                                f"{a.verdict.kind.value}, rule {a.verdict.rule_id}); it did not enter the conversation.")
        body = result.data if a.admitted_ref == a.ref else self.services.store.get(a.admitted_ref, ks.tenant)
        return replace(base, text=body.decode("utf-8", "replace"), is_error=result.is_error,
                       outcome="tool_error" if result.is_error else "ok", ref=a.admitted_ref,
                       admission=a.verdict.kind.value, admission_rule=a.verdict.rule_id, media_type=result.media_type)
