"""Tool calls the policy held for a person (``CONFIRM``), until someone approves or rejects
them (``POST /v1/tool-calls/{id}/approve|reject``; docs/openai.md).

A held call is the model's call with its decision; it is released only by an approval,
which is audited (``ToolCallApproval``, naming who approved and the decision it answers).
Until then the door refuses a tool result for it (the model never reads the output of a
call nobody approved); for a rejected call the model reads a rejection notice, whatever
the client sends as its result.

Held calls live in the server process, bounded and expiring (``TTL_S``): a restart or an
expiry turns a pending call into an unknown one, which is refused like a rejected one
(the hold fails closed: a held call's id starts with ``HELD_PREFIX``, so its result is
refused even when the registry no longer knows it); the decision and any approval stay in
the audit log.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from fak.errors import Conflict, NotFound
from fak.wire import HELD_PREFIX

REJECTED_NOTICE = "[fak] A person rejected this call to {tool}; it did not run."
TTL_S = 24 * 3600
MAX_HELD = 100_000
HoldState = Literal["pending", "approved", "rejected"]


class CallHeld(Conflict):
    """A tool result answers a call that is still held for approval, or was rejected."""

    code = "tool_call_held"


@dataclass(frozen=True)
class HeldCall:
    """One held call: whose, where, what, and what became of it."""

    tenant: str
    session_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    rule_id: str | None
    offending: tuple[str, ...]
    decision_index: int | None
    created: float
    state: HoldState = "pending"
    decided_by: str | None = None
    approval_index: int | None = None
    approval_key: str | None = None  # names the call and its provenance: an approval is remembered by it


class HeldCalls:
    """The held calls of one kernel, by (tenant, call id)."""

    def __init__(self, ttl_s: float = TTL_S, limit: int = MAX_HELD) -> None:
        self._ttl, self._limit = ttl_s, limit  # the limit is per tenant: none can evict another's
        self._calls: dict[str, OrderedDict[str, HeldCall]] = {}
        self._issued: dict[str, OrderedDict[str, str]] = {}
        self._lock = threading.Lock()
        self._deciding: dict[str, threading.Lock] = {}  # one per tenant: a decision's log append runs under it

    def issue(self, tenant: str, call_id: str, tool: str) -> None:
        """Remember which tool a call the door returned names, so a later request that sends
        only its result (a persistent session, a Responses chain) admits it under that tool."""
        with self._lock:
            issued = self._issued.setdefault(tenant, OrderedDict())
            issued[call_id] = tool
            while len(issued) > self._limit:
                issued.popitem(last=False)

    def tool_of(self, tenant: str, call_id: str) -> str | None:
        """The tool of a call the door returned (recently: the memory is bounded), if known."""
        with self._lock:
            issued = self._issued.get(tenant)
            return issued.get(call_id) if issued is not None else None

    def hold(self, call: HeldCall) -> None:
        with self._lock:
            calls = self._expire(call.tenant)
            calls[call.call_id] = call
            while len(calls) > self._limit:
                calls.popitem(last=False)

    def get(self, tenant: str, call_id: str) -> HeldCall | None:
        with self._lock:
            return self._expire(tenant).get(call_id)

    def pending(self, tenant: str) -> list[HeldCall]:
        """The tenant's calls waiting for a person, oldest first (what an approver's queue shows)."""
        with self._lock:
            return [c for c in self._expire(tenant).values() if c.state == "pending"]

    def decide(self, tenant: str, call_id: str, state: Literal["approved", "rejected"], by: str,
               log: Callable[[HeldCall], int]) -> HeldCall:
        """Decide a pending call: ``log(call)`` appends the decision's audit event first, and only
        once it is logged does the call change (a failed append changes nothing). The same
        decision again is answered as it was, unlogged; the other one is a conflict (an approved
        call cannot be rejected afterwards, nor back). The append runs under the tenant's own
        lock, so one tenant's approvals never wait on another's, nor block its chats."""
        with self._lock:
            deciding = self._deciding.setdefault(tenant, threading.Lock())
        with deciding:  # one decision per call: two racing approvals log one event
            call = self.get(tenant, call_id)
            if call is None:
                raise NotFound(f"no held tool call {call_id[:80]!r} (unknown, expired, or the server restarted)")
            if call.state == state:
                return call
            if call.state != "pending":
                raise Conflict(f"tool call {call_id} was already {call.state}")
            decided = replace(call, state=state, decided_by=by)
            decided = replace(decided, approval_index=log(decided))
            with self._lock:
                self._calls.setdefault(tenant, OrderedDict())[call_id] = decided
            return decided

    def result_text(self, tenant: str, call_id: str, text: str) -> str:
        """What the model reads as the result of call ``call_id``: ``text`` for a call that was
        never held or was approved; for a rejected call, a notice instead of whatever the client
        sent (frameworks answer a rejected call with a message of their own); a pending or
        forgotten held call's result is refused (``CallHeld``)."""
        call = self.get(tenant, call_id)
        if call is None and call_id.startswith(HELD_PREFIX):
            raise CallHeld(f"tool call {call_id} was held for approval and is no longer known (expired, or the "
                           "server restarted): its result cannot enter the conversation; ask the model again")
        if call is None or call.state == "approved":
            return text
        if call.state == "rejected":
            return REJECTED_NOTICE.format(tool=call.tool)
        raise CallHeld(f"tool call {call_id} ({call.tool}) is held for approval: its result cannot enter the "
                       f"conversation until a person approves it (POST /v1/tool-calls/{call_id}/approve)")

    def _expire(self, tenant: str) -> OrderedDict[str, HeldCall]:
        """The tenant's held calls, those older than the TTL dropped (under ``_lock``)."""
        calls = self._calls.setdefault(tenant, OrderedDict())
        cutoff = time.time() - self._ttl
        while calls:
            key, first = next(iter(calls.items()))
            if first.created >= cutoff:
                break
            del calls[key]
        return calls
