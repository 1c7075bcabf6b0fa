"""Tool calls the policy held for a person (``CONFIRM``), until someone approves or rejects
them (``POST /v1/tool-calls/{id}/approve|reject``; docs/openai.md), and the approvals a
session remembers.

A held call is the model's call with its decision; it is released only by an approval,
which is audited (``ToolCallApproval``, naming who approved and the decision it answers).
Until then the door refuses a tool result for it (the model never reads the output of a
call nobody approved); for a rejected call the model reads a rejection notice, whatever
the client sends as its result. The result is matched to the held call by its id, and also
by the call's canonical form (tool and canonical arguments, ``form``): a result the client
sends under another id, for an assistant call of its own with the held call's tool and
arguments, is refused or replaced as the held id's would be (``result_for``). A call the
door itself returned (``ALLOW``) carries an id that says so (``new_id``: a MAC over the tenant
and the call's form), so its result is never taken for a held call's.

Who may decide: a principal with the ``approve`` right (an ``approver`` or ``admin`` key, a
person in the console), never the principal whose request produced the call (``producer``).

Held calls and remembered approvals live in the state database (``fak_held_calls``,
``fak_tool_approvals``): a restart keeps them and every replica sees the same ones. Each
row carries a MAC under a key derived from the master secret; a row that fails it is read
as absent, so whoever can write the database but holds no key cannot approve a call, nor
let a session remember an approval (the hold fails closed: a held call's id starts with
``HELD_PREFIX``, so its result is refused even when no valid row is found). A held call's
arguments (and the findings shown to the person) are sealed under the data keys of the refs
in attention when it was written (``fak.state.seal``): a forget of any makes them
unreadable, and the call can then only be rejected. Rows expire after ``approval_ttl_s``
(``fak.settings``): an expired held call is unknown, an expired approval asks again.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import blake3

from fak import wire as w
from fak.errors import Conflict, ContentStoreError, FakError, Forbidden, NotFound
from fak.kernel.calls.authorize import args_bytes, args_digest
from fak.state.schema import HeldCallRow, ToolApprovalRow
from fak.state.seal import ContentKeys, Plain, needs_seal, seal, unseal
from fak.state.store import StateStore, now_us
from fak.wire import HELD_PREFIX

log = logging.getLogger("fak.approvals")
REJECTED_NOTICE = "[fak] A person rejected this call to {tool}; it did not run."
TTL_S = 24 * 3600
MAX_HELD = 100_000
MAX_LISTED = 1000
ISSUED_PREFIX = "call_"
HoldState = Literal["pending", "approved", "rejected"]
Decision = Literal["approved", "rejected"]


class CallHeld(Conflict):
    """A tool result answers a call that is still held for approval, or was rejected."""

    code = "tool_call_held"


class HoldKeys(Protocol):
    """The keys held calls need, derived from the master secret (``fak.kernel.services.DerivedKeys``)."""

    def derive(self, label: str) -> bytes: ...

    def tool_args_key(self) -> bytes: ...


@dataclass(frozen=True)
class HeldCall:
    """One held call: whose, where, what, why, and what became of it. ``arguments`` is None
    when they can no longer be read (the content the call was written from was forgotten)."""

    tenant: str
    session_id: str
    call_id: str
    tool: str
    arguments: Any
    rule_id: str | None
    offending: tuple[str, ...]
    decision_index: int | None
    created: float
    state: HoldState = "pending"
    decided_by: str | None = None
    approval_index: int | None = None
    approval_key: str | None = None  # names the call and its provenance: an approval is remembered by it
    producer: str | None = None  # the principal whose request produced it: never its approver
    findings: tuple[w.ArgumentFindingOut, ...] = ()  # why it was held, as the person is shown
    refs: tuple[str, ...] = ()  # in attention when it was written: its arguments are sealed under their keys
    deciding: Decision | None = None  # a decision claimed and not yet logged (a crash may leave one)
    args_digest: str = ""  # as the audit events carry it
    form: str = field(default="", repr=False)
    row_mac: str = field(default="", repr=False)


def same_principal(producer: str | None, principal: str) -> bool:
    """Whether ``principal`` is the one that produced a call (its audit name may carry the end
    user, ``key:abc/user=alice``)."""
    return producer is not None and (producer == principal or producer.startswith(principal + "/"))


class HeldCalls:
    """The held calls and remembered approvals of a deployment, in its state database."""

    def __init__(self, state: StateStore, content: ContentKeys, keys: HoldKeys, *, ttl_s: float = TTL_S,
                 limit: int = MAX_HELD, on_hold: Callable[[HeldCall], None] | None = None) -> None:
        self._state, self._content = state, content
        self._on_hold = on_hold  # told of each call held (the approvals webhook): it must not block
        self._ttl_us, self._limit = int(ttl_s * 1_000_000), limit  # the limit is per tenant
        self._mac_key = keys.derive("fak/state/held-call")
        self._form_key = keys.derive("fak/tool-call/form")
        self._issue_key = keys.derive("fak/tool-call/issued-id")
        self._args_key = keys.tool_args_key()
        self._issued: dict[str, OrderedDict[str, str]] = {}
        self._lock = threading.Lock()
        self._deciding: dict[str, threading.Lock] = {}  # one per tenant: a decision's log append runs under it

    # --- ids and forms --------------------------------------------------------------------
    def form(self, tool: str, args: Any) -> str:
        """The call's canonical form: a keyed digest of its tool and canonical arguments (RFC 8785)."""
        msg = json.dumps(tool).encode() + b"\x00" + args_bytes(args)
        return "blake3k:" + blake3.blake3(msg, key=self._form_key).hexdigest()

    def new_id(self, tenant: str, tool: str, args: Any, *, held: bool) -> str:
        """A new id for a call the door returns: a held call's says so (``HELD_PREFIX``); an
        allowed one's carries a MAC over the tenant and the call's form, so a later result for
        it is known to answer exactly the call fak returned, on any replica, after a restart."""
        if held:
            return HELD_PREFIX + secrets.token_hex(12)
        nonce = secrets.token_hex(8)
        return ISSUED_PREFIX + nonce + self._tag(tenant, nonce, self.form(tool, args))

    def issued_here(self, tenant: str, call_id: str, tool: str, args: Any) -> bool:
        """Whether ``call_id`` is an id the door gave an allowed call of ``tool`` with ``args``."""
        body = call_id[len(ISSUED_PREFIX):] if call_id.startswith(ISSUED_PREFIX) else ""
        if len(body) != 40 or call_id.startswith(HELD_PREFIX):
            return False
        try:
            form = self.form(tool, args)
        except FakError:
            return False
        return hmac.compare_digest(body[16:], self._tag(tenant, body[:16], form))

    def _tag(self, tenant: str, nonce: str, form: str) -> str:
        return blake3.blake3(json.dumps([tenant, nonce, form]).encode(), key=self._issue_key).hexdigest()[:24]

    def issue(self, tenant: str, call_id: str, tool: str) -> None:
        """Remember which tool a call the door returned names, so a later request that sends
        only its result (a persistent session, a Responses chain) admits it under that tool."""
        with self._lock:
            issued = self._issued.setdefault(tenant, OrderedDict())
            issued[call_id] = tool
            while len(issued) > self._limit:
                issued.popitem(last=False)

    def tool_of(self, tenant: str, call_id: str) -> str | None:
        """The tool of a call the door returned (recently, in this process: the memory is
        bounded), or of a held call, if known."""
        with self._lock:
            issued = self._issued.get(tenant)
            tool = issued.get(call_id) if issued is not None else None
        if tool is None and call_id.startswith(HELD_PREFIX):
            held = self.get(tenant, call_id)
            tool = held.tool if held is not None else None
        return tool

    # --- held calls -----------------------------------------------------------------------
    def hold(self, call: HeldCall) -> HeldCall:
        """Keep a held call (state ``pending``); its arguments and findings sealed under the data
        keys of ``call.refs`` where any carries one. A seal that cannot be made (a ref forgotten
        meanwhile) keeps the call without them: its result is refused all the same."""
        if not call.call_id.startswith(HELD_PREFIX):  # what refuses its result when no row is found
            raise ValueError(f"a held call's id starts with {HELD_PREFIX!r}")
        body = json.dumps({"arguments": call.arguments, "findings": [f.model_dump() for f in call.findings]},
                          ensure_ascii=False)
        plain: str | None = body
        sealed: bytes | None = None
        refs = sorted(set(call.refs))
        try:
            keys = self._content.content_keys(call.tenant, refs) if refs else {}
            if needs_seal(keys):
                sealed, plain = seal(keys, call.tenant, call.session_id, call.call_id, Plain([], None, body)), None
        except (ContentStoreError, NotFound):
            plain = None
        held = replace(call, state="pending", deciding=None, decided_by=None, approval_index=None,
                       args_digest=args_digest(self._args_key, call.arguments), form=self.form(call.tool, call.arguments))
        row = HeldCallRow(
            tenant=held.tenant, call_id=held.call_id, session_id=held.session_id, tool=held.tool, form=held.form,
            args_digest=held.args_digest, plain=plain, sealed=sealed, content=json.dumps(refs), rule_id=held.rule_id,
            offending=json.dumps(list(held.offending)), decision_index=held.decision_index, producer=held.producer,
            approval_key=held.approval_key, created_us=int(held.created * 1_000_000), state="pending", deciding=None,
            decided_by=None, approval_index=None, mac="")
        row.mac = self._row_mac(row)
        self._state.add_held_call(row, limit=self._limit, since_us=now_us() - self._ttl_us)
        held = replace(held, row_mac=row.mac)
        if self._on_hold is not None:
            try:
                self._on_hold(held)
            except Exception:  # the call is held and recorded: a notice that fails never fails the request
                log.exception("the hook told of held call %s failed", held.call_id)
        return held

    def get(self, tenant: str, call_id: str) -> HeldCall | None:
        """The held call, None if unknown, expired, or its row fails its MAC."""
        row = self._state.held_call(tenant, call_id)
        return self._read(row) if row is not None else None

    def listed(self, tenant: str, state: HoldState = "pending", limit: int = MAX_LISTED) -> list[HeldCall]:
        """The tenant's held calls in ``state``, oldest first (what an approver's queue shows)."""
        rows = self._state.held_calls(tenant, state, now_us() - self._ttl_us, max(1, min(limit, MAX_LISTED)))
        return [c for c in (self._read(r) for r in rows) if c is not None]

    def pending(self, tenant: str) -> list[HeldCall]:
        """The tenant's calls waiting for a person, oldest first."""
        return self.listed(tenant, "pending")

    def decide(self, tenant: str, call_id: str, state: Decision, by: str, log: Callable[[HeldCall], int]) -> HeldCall:
        """Decide a pending call: the decision is claimed on its row, ``log(call)`` appends its
        audit event, and only then does the call change (a failed append releases the claim,
        changing nothing; a crash leaves the claim, which the same decision completes). The same
        decision again is answered as it was, unlogged; the other one is a conflict (an approved
        call cannot be rejected afterwards, nor back). Of two replicas deciding at once, one
        changes the row. ``by`` may not approve a call its own request produced."""
        with self._lock:
            deciding = self._deciding.setdefault(tenant, threading.Lock())
        with deciding:  # one decision per call in this process: two racing approvals log one event
            call = self.get(tenant, call_id)
            if call is None:
                raise NotFound(f"no held tool call {call_id[:80]!r} (unknown, expired, or its record fails its check)")
            if state == "approved" and same_principal(call.producer, by):
                raise Forbidden(f"{by} produced tool call {call_id}: the principal whose request produced a held "
                                "call may not approve it (an approver or admin key of a person does)")
            if call.state == state:
                return call
            if call.state != "pending":
                raise Conflict(f"tool call {call_id} was already {call.state}")
            if call.deciding not in (None, state):
                raise Conflict(f"tool call {call_id} is being {call.deciding} (a decision claimed and not yet "
                               "recorded: the same decision again completes it)")
            if state == "approved" and call.arguments is None:
                raise Conflict(f"tool call {call_id} was written from content that was forgotten since (or its "
                               "arguments cannot be read): it can only be rejected")
            claimed = self._change(call, {"deciding": state, "decided_by": by})
            if claimed is None:
                return self._settled(tenant, call_id, state)
            try:
                index = log(replace(claimed, state=state))
            except BaseException:
                self._change(claimed, {"deciding": None, "decided_by": None})
                raise
            decided = self._change(claimed, {"state": state, "deciding": None, "approval_index": index})
            return decided if decided is not None else self._settled(tenant, call_id, state)

    def _settled(self, tenant: str, call_id: str, state: Decision) -> HeldCall:
        """After another replica changed the row first: its outcome, if it is ``state``."""
        now = self.get(tenant, call_id)
        if now is not None and now.state == state:
            return now
        raise Conflict(f"tool call {call_id} is being decided elsewhere, or was decided otherwise")

    def _change(self, call: HeldCall, values: dict[str, Any]) -> HeldCall | None:
        """Write ``values`` to the call's row if it is still the row read; the call after, or None."""
        row = self._state.held_call(call.tenant, call.call_id)
        if row is None or row.mac != call.row_mac:
            return None
        for name, value in values.items():
            setattr(row, name, value)
        row.mac = self._row_mac(row)
        if not self._state.update_held_call(call.tenant, call.call_id, call.row_mac, values | {"mac": row.mac}):
            return None
        return self._read(row)

    def claim_execution(self, tenant: str, call_id: str) -> HeldCall:
        """Mark an approved call as run by fak itself (an MCP tool): once only, on every replica;
        ``Conflict`` when it is not approved or was run already."""
        call = self.get(tenant, call_id)
        if call is None:
            raise NotFound(f"no held tool call {call_id[:80]!r} (unknown, expired, or its record fails its check)")
        if call.state != "approved":
            raise Conflict(f"tool call {call_id} is {call.state}: only an approved call runs")
        row = self._state.held_call(tenant, call_id)
        if row is None or row.executed_us is not None:
            raise Conflict(f"tool call {call_id} was run already: an approval runs its call once")
        claimed = self._change(call, {"executed_us": now_us()})
        if claimed is None:
            raise Conflict(f"tool call {call_id} was run already: an approval runs its call once")
        return claimed

    def result_text(self, tenant: str, call_id: str, text: str) -> str:
        """What the model reads as the result of call ``call_id``: ``text`` for a call that was
        never held or was approved; for a rejected call, a notice instead of whatever the client
        sent (frameworks answer a rejected call with a message of their own); a pending or
        unknown held call's result is refused (``CallHeld``). Only a held call's id (``HELD_PREFIX``)
        names a row: another id is not looked up."""
        if not call_id.startswith(HELD_PREFIX):
            return text
        call = self.get(tenant, call_id)
        if call is None and call_id.startswith(HELD_PREFIX):
            raise CallHeld(f"tool call {call_id} was held for approval and is no longer known (expired, or its record "
                           "fails its check): its result cannot enter the conversation; ask the model again")
        return self._answer(call, call_id, text)

    def forms_held(self, tenant: str, calls: Sequence[tuple[str, Any]]) -> frozenset[str]:
        """Of the forms of ``calls`` (tool, arguments), those some unexpired held call of the
        tenant has (any state, whether or not its row verifies): one query for a request's
        results, so ``result_for`` looks up the rows of a form only where there are some."""
        forms: set[str] = set()
        for tool, args in calls:
            try:
                forms.add(self.form(tool, args))
            except FakError:
                continue
        return frozenset(self._state.held_forms(tenant, forms, now_us() - self._ttl_us)) if forms else frozenset()

    def result_for(self, tenant: str, call_id: str, tool: str, args: Any, text: str, *,
                   held_forms: Container[str] | None = None) -> str:
        """What the model reads as the result of the client's call ``call_id`` to ``tool`` with
        ``args`` (an assistant call the request carries). A held id answers as ``result_text``
        when the call it carries is the held call's; an id the door gave exactly this call
        (``new_id``) passes; any other id (an approved held call's id carrying other arguments
        included) is matched by the call's form against the tenant's held calls: a pending one
        (or one whose record fails its check) refuses the result, a rejected one replaces it by
        the notice. ``held_forms`` (``forms_held`` of the request's calls): a form not in it has
        no held call, and no row is read for it."""
        try:
            form: str | None = self.form(tool, args)
        except FakError:
            form = None
        if call_id.startswith(HELD_PREFIX):
            answer = self.result_text(tenant, call_id, text)  # refused while pending or unknown
            held = self.get(tenant, call_id)
            if held is None or held.form == form or answer != text:
                return answer
        elif self.issued_here(tenant, call_id, tool, args):
            return self.result_text(tenant, call_id, text)
        if form is None:
            return self.result_text(tenant, call_id, text)
        if held_forms is not None and form not in held_forms:
            return text
        rows = self._state.held_calls_of_form(tenant, form, now_us() - self._ttl_us)
        calls = [self._read(r) for r in rows]
        if any(c is None for c in calls):
            raise CallHeld(f"tool call {call_id} ({tool}) is a call fak held for approval, whose record fails its "
                           "check: its result cannot enter the conversation")
        for held_call in [c for c in calls if c is not None and c.state != "approved"]:
            return self._answer(held_call, call_id, text)
        return text

    @staticmethod
    def _answer(call: HeldCall | None, call_id: str, text: str) -> str:
        if call is None or call.state == "approved":
            return text
        if call.state == "rejected":
            return REJECTED_NOTICE.format(tool=call.tool)
        named = "" if call.call_id == call_id else f" (the call fak held as {call.call_id})"
        raise CallHeld(f"tool call {call_id}{named} ({call.tool}) is held for approval: its result cannot enter the "
                       f"conversation until a person approves it (POST /v1/tool-calls/{call.call_id}/approve)")

    # --- remembered approvals ---------------------------------------------------------------
    def remember(self, tenant: str, session_id: str, session_created_us: int, key: str, call_id: str,
                 approval_index: int) -> bool:
        """Let session ``session_id`` (the one created at ``session_created_us``: a later session
        of the same id starts without it) allow the call ``key`` names until the approval
        expires; whether the session still exists to remember it."""
        created = now_us()
        row = ToolApprovalRow(tenant=tenant, session_id=session_id, key=key, call_id=call_id,
                              approval_index=approval_index, created_us=created, expires_us=created + self._ttl_us, mac="")
        row.mac = self._approval_mac(row, session_created_us)
        return self._state.remember_approval(row)

    def approved(self, tenant: str, session_id: str, session_created_us: int, key: str) -> int | None:
        """The audit index of the approval session ``session_id`` remembers for ``key``, if one
        is there, unexpired and its MAC verifies; else None (the call is asked about again)."""
        row = self._state.approval(tenant, session_id, key)
        if row is None or row.expires_us <= now_us():
            return None
        if not hmac.compare_digest(row.mac, self._approval_mac(row, session_created_us)):
            return None
        return row.approval_index

    # --- rows -----------------------------------------------------------------------------
    def _read(self, row: HeldCallRow) -> HeldCall | None:
        """The call a row holds, if its MAC verifies and it has not expired."""
        if not hmac.compare_digest(row.mac or "", self._row_mac(row)) or row.created_us < now_us() - self._ttl_us:
            return None
        if row.state not in ("pending", "approved", "rejected") or row.deciding not in (None, "approved", "rejected"):
            return None
        refs: list[str] = json.loads(row.content)
        arguments: Any = None
        findings: list[w.ArgumentFindingOut] = []
        body = row.plain
        if body is None and row.sealed is not None:
            try:
                body = unseal(self._content.content_keys(row.tenant, refs), row.tenant, row.session_id, row.call_id,
                              row.sealed).text
            except (ContentStoreError, FakError):
                body = None  # forgotten since: the call can be rejected, never approved
        if body is not None:
            opened = json.loads(body)
            arguments = opened["arguments"]
            findings = [w.ArgumentFindingOut.model_validate(f) for f in opened["findings"]]
        return HeldCall(
            tenant=row.tenant, session_id=row.session_id, call_id=row.call_id, tool=row.tool, arguments=arguments,
            rule_id=row.rule_id, offending=tuple(json.loads(row.offending)), decision_index=row.decision_index,
            created=row.created_us / 1_000_000, state=row.state,  # type: ignore[arg-type]
            decided_by=row.decided_by, approval_index=row.approval_index, approval_key=row.approval_key,
            producer=row.producer, findings=tuple(findings), refs=tuple(refs),
            deciding=row.deciding,  # type: ignore[arg-type]
            args_digest=row.args_digest, form=row.form, row_mac=row.mac)

    def _row_mac(self, row: HeldCallRow) -> str:
        sealed = blake3.blake3(row.sealed).hexdigest() if row.sealed is not None else None
        fields: Sequence[object] = [
            "held-call/1", row.tenant, row.call_id, row.session_id, row.tool, row.form, row.args_digest, row.plain,
            sealed, row.content, row.rule_id, row.offending, row.decision_index, row.producer, row.approval_key,
            row.created_us, row.state, row.deciding, row.decided_by, row.approval_index]
        if row.executed_us is not None:  # written after state_0013 only: older rows keep their MAC
            fields = [*fields, "executed", row.executed_us]
        return "blake3k:" + blake3.blake3(json.dumps(fields).encode(), key=self._mac_key).hexdigest()

    def _approval_mac(self, row: ToolApprovalRow, session_created_us: int) -> str:
        fields = ["approval/1", row.tenant, row.session_id, session_created_us, row.key, row.call_id,
                  row.approval_index, row.created_us, row.expires_us]
        return "blake3k:" + blake3.blake3(json.dumps(fields).encode(), key=self._mac_key).hexdigest()
