"""MCP tools in the Responses API (docs/mcp.md): a request's ``tools`` entry ``{type: "mcp",
server_label, server_url, allowed_tools, require_approval}`` names a server the deployment
declares (``Settings.mcp_servers``; any other label or URL is a 400 naming it), and fak runs
that server's tools itself, after its own decision on each call.

**A response with MCP tools** is a loop of chat turns in the chain's session (a ``store: false``
new chain runs in a session of its own, deleted after it):

1. each server is listed now (``McpServers.offer``: the deployment's ``allowed_tools``, the
   request's, and the pins: a tool whose definition changed since an operator approved it is
   withheld and logged); an ``mcp_list_tools`` item per server;
2. the model is shown the request's function tools and the servers' tools; each server's
   definitions enter attention as a ref of their own under ``mcp:<label>`` from the server's
   URL (``chat.Hosted``): its trust is the policy's for that name, and the gate reads them like
   any tool result (a flagged description quarantines the block, and the model may call none
   of its tools);
3. every call the model writes is decided by the policy under ``mcp:<label>/<tool>``. ALLOW:
   fak calls the server (``McpToolCalled`` logged), an ``mcp_call`` item carries the output or
   the error, and the result is admitted in the next turn under ``mcp:<label>/<tool>`` with the
   server's URL as source; CONFIRM: the call is held for a person and answered by an
   ``mcp_approval_request`` item (its id is the held call's); DENY: nothing runs, the chat core's
   ``on_deny`` remedy applies. A request's ``require_approval`` (OpenAI's default is
   ``always``) asks the client about an allowed call too: an ``mcp_approval_request`` whose
   id is the call's;
4. the loop ends when a turn writes no MCP call to run, asks for an approval, or calls a
   function tool (the client runs it), after ``MAX_ROUNDS`` turns, or when
   ``max_output_tokens`` is spent (``incomplete``). ``tool_choice`` applies to the first turn.

**Approvals** (a follow-up's ``mcp_approval_response`` items, before its first turn): for a
held call (a policy CONFIRM), approving is the same audited decision as
``POST /v1/tool-calls/{id}/approve`` and needs the same right: an approver or admin key that
did not produce the call. The agent's own key cannot approve what the policy held; it sends
``approve: true`` once a person approved the call (console, REST), and the call then runs
with the arguments fak held, never those of the request. ``approve: false`` declines it (the
agent's right suffices). For a call the policy allowed but the request asked about, the
approval is the client's, and the call is decided again, now, in the session: it runs only if
the policy still allows it.

**Streaming** with MCP tools runs the loop and then sends each output item's events in order
(``response.mcp_list_tools.*``, ``response.mcp_call.*``, ``response.mcp_call_arguments.*``,
``response.output_text.*``): a stream's text arrives per turn, not per token."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from fak import wire as w
from fak import wire_responses as wr
from fak.audit.events import McpToolCalled
from fak.errors import Conflict, FakError, InvalidInput, NotFound
from fak.kernel.calls.authorize import args_digest
from fak.kernel.calls.tool_text import spec_of
from fak.kernel.mcp.client import McpError, McpResult, McpTool
from fak.kernel.mcp.servers import McpServers, UnknownMcpServer, provenance
from fak.kernel.openai import chat
from fak.kernel.openai.chat import UnsupportedParameter
from fak.kernel.openai.responses_mcp_plan import McpPlan, ServerUse, source_url
from fak.kernel.openai.responses_output import output_items, status_of, usage_of
from fak.kernel.openai.responses_store import opened
from fak.kernel.session.caller import Caller
from fak.types import as_id

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.kernel.openai.responses_request import Plan

__all__ = ["MAX_ROUNDS", "McpPlan", "ServerUse", "prepare", "run"]

MAX_ROUNDS = 8  # chat turns of one response: calls run, results admitted, the model asked again


def _hex() -> str:
    return uuid.uuid4().hex[:24]


def _names(value: Any, where: str) -> frozenset[str] | None:
    """``allowed_tools``: a list of names, or ``{tool_names: [...]}``; None: every tool."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("tool_names")
        if value is None:
            return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidInput(f"{where}: a list of tool names, or {{'tool_names': [...]}}", param=where)
    return frozenset(value)


def _asker(value: Any, where: str) -> Callable[[str], bool]:
    """``require_approval``: ``always`` (OpenAI's default), ``never``, or
    ``{always: {tool_names}, never: {tool_names}}`` (a tool in neither list is asked about)."""
    if value is None or value == "always":
        return lambda _name: True
    if value == "never":
        return lambda _name: False
    if isinstance(value, dict):
        always = _names(value.get("always"), f"{where}.always") or frozenset()
        never = _names(value.get("never"), f"{where}.never") or frozenset()
        return lambda name: name in always or name not in never
    raise InvalidInput(f"{where}: 'always', 'never' or {{'always': {{'tool_names': [...]}}, 'never': ...}}",
                       param=where)


def prepare(k: Kernel, tools: list[dict[str, Any]]) -> McpPlan | None:
    """The request's ``mcp`` tools resolved against the deployment's servers and listed now
    (None: the request has none). Every refusal comes before anything is created."""
    entries = [(i, t) for i, t in enumerate(tools) if t.get("type") == "mcp"]
    if not entries:
        return None
    servers: McpServers | None = k.services.mcp
    if servers is None or not servers.labels():
        raise UnknownMcpServer("tools: this deployment declares no MCP server (mcp_servers)", param="tools")
    uses: list[ServerUse] = []
    ignored: list[str] = []
    by_name: dict[str, tuple[ServerUse, McpTool]] = {}
    function_names = {str(t.get("name")) for t in tools if t.get("type") == "function"}
    for i, entry in entries:
        where = f"tools[{i}]"
        label = entry.get("server_label")
        if not isinstance(label, str) or not label:
            raise InvalidInput(f"{where}.server_label: a non-empty string is required", param=f"{where}.server_label")
        if entry.get("connector_id") is not None:
            raise UnsupportedParameter(f"{where}.connector_id: OpenAI's connectors are not fak's; declare the "
                                       "server in mcp_servers", param=f"{where}.connector_id")
        url = entry.get("server_url")
        if url is not None and not isinstance(url, str):
            raise InvalidInput(f"{where}.server_url: a string", param=f"{where}.server_url")
        servers.get(label, url)  # a 400 naming an undeclared label or URL
        if entry.get("headers"):
            ignored.append(f"{where}.headers")  # credentials are the deployment's (headers_env)
        if any(u.label == label for u in uses):
            raise InvalidInput(f"{where}: MCP server {label!r} is named twice", param=where)
        offer = servers.offer(label, _names(entry.get("allowed_tools"), f"{where}.allowed_tools"))
        item = wr.McpListToolsItem(id="mcpl_" + _hex(), server_label=label, tools=[
            wr.McpListedTool.model_validate(t.listed()) for t in offer.offered])
        use = ServerUse(label, offer, _asker(entry.get("require_approval"), f"{where}.require_approval"), item)
        uses.append(use)
        for t in offer.offered:
            other = by_name.get(t.name)
            if other is not None or t.name in function_names:
                who = f"MCP server {other[0].label!r}" if other is not None else "a function tool"
                raise InvalidInput(f"{where}: tool {t.name!r} of MCP server {label!r} has the name of {who}; "
                                   "narrow allowed_tools so that every tool the model is shown has its own name",
                                   param=where)
            by_name[t.name] = (use, t)
    return McpPlan(tuple(uses), by_name, tuple(ignored))


# --- the loop ------------------------------------------------------------------------
@dataclass
class _Run:
    """One response's loop: what it has output and what the next turn admits."""

    k: Kernel
    c: Caller
    p: Plan
    m: McpPlan
    session_id: str
    output: list[Any] = field(default_factory=list)
    messages: list[w.ChatMessage] = field(default_factory=list)  # results the next turn admits
    results: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    calls: dict[str, wr.McpCallItem] = field(default_factory=dict)  # call id -> its item (admission checked)
    infos: list[w.FakInfo] = field(default_factory=list)
    usages: list[w.Usage] = field(default_factory=list)
    provenance: set[str] = field(default_factory=set)
    finish: str | None = None
    logged: list[Future[int]] = field(default_factory=list)  # the calls' McpToolCalled, committing

    def execute(self, use: ServerUse, tool: McpTool, call_id: str, arguments: str, decision_index: int | None,
                approval_request_id: str | None = None) -> None:
        """Run the call on its server: its ``mcp_call`` item, and its result for the next turn."""
        k, label = self.k, use.label
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            args = None
        result: McpResult | None = None
        error: dict[str, Any] | None = None
        if not isinstance(args, dict):
            error = {"type": "mcp_protocol_error", "code": -32602, "message": "the arguments are not a JSON object"}
        else:
            try:
                result = k.services.mcp.call(label, tool.name, args) if k.services.mcp is not None else None
            except McpError as exc:
                error = {"type": "mcp_protocol_error", "code": -32603, "message": str(exc)}
        if result is not None and result.is_error:
            error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": result.text}]}
        outcome: Literal["ok", "tool_error", "failed"] = (
            "failed" if result is None else "tool_error" if result.is_error else "ok")
        self.logged.append(k.audit.submit(McpToolCalled(
            tenant=self.c.tenant, session_id=as_id(self.session_id), server=as_id(label),
            tool=as_id(provenance(label, tool.name)), call_id=as_id(call_id),
            args_digest=args_digest(k.services.keys.tool_args_key(), args if isinstance(args, dict) else arguments),
            decision_index=decision_index, outcome=outcome, via="responses")))  # awaited before the response
        text = result.text if result is not None else f"[fak] the call failed: {error['message'] if error else ''}"
        item = wr.McpCallItem(id="mcp_" + _hex(), server_label=label, name=tool.name, arguments=arguments,
                              output=result.text if result is not None and not result.is_error else None,
                              error=error, status="completed" if result is not None else "failed",
                              approval_request_id=approval_request_id)
        self.output.append(item)
        self.calls[call_id] = item
        self.messages.append(w.ChatMessage(role="tool", tool_call_id=call_id, content=text))
        self.results[call_id] = (provenance(label, tool.name), source_url(use.offer.source))

    def withheld(self, admissions: list[w.AdmissionInfo]) -> None:
        """A result the gate kept out of attention is not shown in its ``mcp_call`` item either."""
        for a in admissions:
            item = self.calls.pop(a.tool_call_id or "", None)
            if item is not None and not a.admitted:
                notice = (f"[fak] the result was not admitted: {a.verdict}"
                          + (f" by rule {a.rule_id}" if a.rule_id else ""))
                i = self.output.index(item)
                self.output[i] = item.model_copy(update={"output": None, "status": "failed", "error": {
                    "type": "mcp_tool_execution_error", "content": [{"type": "text", "text": notice}]}})


def _approval_requests(k: Kernel, c: Caller, p: Plan) -> dict[str, dict[str, Any]]:
    """The approval requests a follow-up may answer: its predecessor's, and any resent in its input."""
    found: dict[str, dict[str, Any]] = {}
    for item in p.body.items():
        if isinstance(item, dict) and item.get("type") == "mcp_approval_request" and isinstance(item.get("id"), str):
            found[item["id"]] = item
    if p.chain.previous is not None:
        row = k.state.response(c.tenant, p.chain.previous)
        if row is not None:
            try:
                previous = opened(k, c, row)
            except FakError:
                previous = None
            for out in previous.output if previous is not None else []:
                if isinstance(out, wr.McpApprovalRequestItem):
                    found[out.id] = out.model_dump()
    return found


def _answers(p: Plan) -> bool:
    return any(isinstance(i, dict) and i.get("type") == "mcp_approval_response" for i in p.body.items())


def _answer_approvals(r: _Run) -> None:
    """The request's ``mcp_approval_response`` items, each decided and run (or declined) before
    the first turn (see the module notes)."""
    k, c = r.k, r.c
    responses = [i for i in r.p.body.items() if isinstance(i, dict) and i.get("type") == "mcp_approval_response"]
    if not responses:
        return
    requests = _approval_requests(k, c, r.p)
    # a resent history carries the call an approval ran: that approval is answered already
    answered = {i.get("approval_request_id") for i in r.p.body.items()
                if isinstance(i, dict) and i.get("type") == "mcp_call"}
    for n, item in enumerate(responses):
        where = f"input (mcp_approval_response {n})"
        rid, approve = item.get("approval_request_id"), item.get("approve")
        if not isinstance(rid, str) or not isinstance(approve, bool):
            raise InvalidInput(f"{where}: approval_request_id (a string) and approve (a boolean) are required",
                               param="input")
        if rid in answered:
            continue
        held = k.services.holds.get(c.tenant, rid)
        if held is not None:
            _answer_held(r, held.tool, rid, approve, held.decision_index, held.state, where)
            continue
        asked = requests.get(rid)
        if asked is None:
            raise InvalidInput(f"{where}: no approval request {rid[:80]!r} in this chain or this input",
                               param="input")
        _answer_asked(r, asked, rid, approve, where)


def _tool(r: _Run, name: str, where: str) -> tuple[ServerUse, McpTool]:
    found = r.m.tools.get(name)
    if found is None:
        raise InvalidInput(f"{where}: tool {name[:64]!r} is not offered by this request's MCP servers (now)",
                           param="input")
    return found


def _answer_held(r: _Run, name: str, rid: str, approve: bool, decision_index: int | None, state: str,
                 where: str) -> None:
    """An answer to a call the policy held: a person's approval (or this caller's, if it may
    approve), then the call, once, with the arguments fak held (``HeldCalls.claim_execution``:
    an approval sent again, or by a resent history without its ``mcp_call``, runs nothing)."""
    k, c = r.k, r.c
    use, tool = _tool(r, name, where)
    if _decided_as(k, c, decision_index) != provenance(use.label, tool.name):
        # a call held at the chat door (a function the client runs) or for another server's tool
        # of the same name: its approval is not one to run on this server
        raise InvalidInput(f"{where}: held call {rid} was not a call of MCP server {use.label!r}'s {tool.name!r}",
                           param="input")
    if not approve:
        if state == "pending":
            chat.decline_held_call(k, c, rid)
        r.messages.append(w.ChatMessage(role="tool", tool_call_id=rid, content="[the call was declined]"))
        return
    if state != "approved":
        chat.decide_held_call(k, c, rid, approve=True)  # the approve right, and not the call's producer
    held = k.services.holds.claim_execution(c.tenant, rid)
    if held.arguments is None:
        raise Conflict(f"{where}: held call {rid}'s arguments can no longer be read (forgotten content)")
    r.execute(use, tool, rid, json.dumps(held.arguments, ensure_ascii=False), decision_index,
              approval_request_id=rid)


def _decided_as(k: Kernel, c: Caller, index: int | None) -> str | None:
    """The tool a held call's decision was made under, as the signed log records it."""
    if index is None:
        return None
    try:
        event = k.audit.entry(index).event
    except FakError:
        return None
    if event.type != "tool_call_decision" or event.tenant != c.tenant:
        return None
    return str(event.tool)


def _answer_asked(r: _Run, asked: dict[str, Any], rid: str, approve: bool, where: str) -> None:
    """An answer to an approval the request asked for (``require_approval``): declined, or
    decided again now by the policy and run only if it allows it."""
    k, c = r.k, r.c
    name, arguments = str(asked.get("name", "")), str(asked.get("arguments", ""))
    use, tool = _tool(r, name, where)
    if not approve:
        r.messages.append(w.ChatMessage(role="tool", tool_call_id=rid, content="[the user declined the call]"))
        return
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise InvalidInput(f"{where}: the approved call's arguments are not JSON", param="input") from None
    try:
        ks = k.session(c.tenant, r.session_id)
    except NotFound:  # a new chain whose input is only approvals: nothing in attention yet
        ks = k.create_session(c.tenant, r.session_id)
    spec = replace(spec_of(tool.definition()["function"], "tools"), governed=provenance(use.label, tool.name))
    decision = ks.authorize_tool_call(provenance(use.label, tool.name), args, principal=c.principal, tool=spec)
    if decision.verdict != "ALLOW":
        r.output.append(wr.McpCallItem(
            id="mcp_" + _hex(), server_label=use.label, name=tool.name, arguments=arguments, status="failed",
            approval_request_id=rid, error={"type": "mcp_protocol_error", "code": -32001, "message": (
                f"fak's policy decides {decision.verdict} now (rule {decision.rule_id or 'unlisted'}): not run")}))
        r.messages.append(w.ChatMessage(role="tool", tool_call_id=rid, content=(
            f"[fak] the call was not run: the policy decides {decision.verdict}")))
        return
    r.execute(use, tool, rid, arguments, decision.audit_index, approval_request_id=rid)


def _turn(r: _Run, body: w.ChatCompletionRequest) -> tuple[bool, w.ChatCompletion]:
    """One chat turn: its message and calls as output items; whether the loop goes on."""
    done = chat.completed(r.k, r.c, body, r.m.hosted(r.results))
    completion = done.completion
    r.provenance |= done.provenance
    r.usages.append(completion.usage)
    if completion.fak is not None:
        r.infos.append(completion.fak)
        r.withheld(completion.fak.admissions)
    r.messages, r.results = [], {}
    choice = completion.choices[0]
    r.finish = choice.finish_reason
    verdicts = {v.id: v for v in (completion.fak.tool_calls if completion.fak else [])}
    message = choice.message
    plain = replace_calls(choice, [t for t in message.tool_calls or [] if t.function.name not in r.m.tools])
    items = output_items(r.p, plain, index=len(r.output))
    r.output += [i for i in items if not (isinstance(i, wr.OutputMessage) and _empty(i))]
    go_on = False
    stop = any(isinstance(i, wr.FunctionCallItem) for i in items)
    for call in message.tool_calls or []:
        found = r.m.tools.get(call.function.name)
        if found is None:
            continue
        use, tool = found
        v = verdicts.get(call.id)
        if v is None or (v.verdict != "ALLOW" and not v.held):  # no ALLOW of fak's for it: never run
            continue
        if v.held or use.ask(tool.name):  # the policy holds it, or the request asks
            r.output.append(wr.McpApprovalRequestItem(id=call.id, server_label=use.label, name=tool.name,
                                                      arguments=call.function.arguments))
            stop = True
        else:
            r.execute(use, tool, call.id, call.function.arguments, v.audit_index)
            go_on = True
    return go_on and not stop, completion


def _empty(item: wr.OutputMessage) -> bool:
    return all(isinstance(p, wr.OutputText) and not p.text for p in item.content)


def replace_calls(choice: w.Choice, calls: list[w.ToolCallOut]) -> w.Choice:
    """``choice`` with only ``calls`` (the MCP calls become items of their own)."""
    return choice.model_copy(update={"message": choice.message.model_copy(update={"tool_calls": calls or None})})


def run(k: Kernel, c: Caller, p: Plan, m: McpPlan) -> tuple[wr.ResponseObject, frozenset[str]]:
    """The response's loop (see the module notes): the response and the refs its body may quote."""
    assert p.chain.session_id is not None  # responses.create gives a store: false chain a session of its own
    r = _Run(k, c, p, m, p.chain.session_id)
    r.output += [s.item for s in m.servers]
    # a resent history's mcp_call outputs are admitted under the governed name of a tool this
    # request offers (second-hand: no source; the client's word, as any resent result is)
    offered = {(use.label, name) for name, (use, _) in m.tools.items()}
    r.results = {i["id"]: (provenance(i["server_label"], i["name"]), None)
                 for i in p.body.items() if isinstance(i, dict) and i.get("type") == "mcp_call"
                 and isinstance(i.get("id"), str) and (i.get("server_label"), i.get("name")) in offered}
    history = list(p.chat_body.messages)
    if history and _answers(p):
        # approvals in a request that also carries messages (a resent history: the Agents SDK's
        # default): the messages enter the session first, so that a call approved is decided
        # again against what the session now holds (the resent inbox included), not before it
        chat.open_turn(k, c, p.chat_body, m.hosted(r.results)).close()
        history = []
    _answer_approvals(r)
    budget = p.chat_body.max_completion_tokens
    body = p.chat_body.model_copy(update={"messages": [*history, *r.messages]})
    r.messages = []
    for n in range(MAX_ROUNDS):
        go_on, _ = _turn(r, body)
        spent = sum(u.completion_tokens for u in r.usages)
        if not go_on or n == MAX_ROUNDS - 1:
            break
        if budget is not None and spent >= budget:
            r.finish = "length"
            break
        body = p.chat_body.model_copy(update={
            "messages": list(r.messages), "tool_choice": "auto" if p.chat_body.tool_choice is not None else None,
            "max_completion_tokens": None if budget is None else budget - spent})
    if r.messages:  # results of the last round's calls, which no turn read: kept in the session
        ks = k.session(c.tenant, r.session_id)
        for msg in r.messages:
            tool, source = r.results[msg.tool_call_id or ""]
            a = ks.admit(tool, str(msg.content).encode("utf-8", "surrogatepass"), source=source)
            r.withheld([w.AdmissionInfo(message_index=-1, tool=tool, tool_call_id=msg.tool_call_id,
                                        verdict=a.verdict.kind.value, rule_id=a.verdict.rule_id, ref=a.ref,
                                        admitted_ref=a.admitted_ref, admitted=a.admitted, segment_id=a.segment.id,
                                        audit_index=a.audit_index)])
    if not any(isinstance(i, wr.OutputMessage) for i in r.output) and not any(
            isinstance(i, wr.McpApprovalRequestItem | wr.FunctionCallItem | wr.McpCallItem) for i in r.output):
        r.output.append(wr.OutputMessage(id="msg_" + _hex(), status="completed", content=[wr.OutputText(text="")]))
    for f in r.logged:  # every call run is in the log before the response says so
        f.result()
    usage = _usage(r.usages)
    info = _info(r.infos, m)
    response = p.response(status_of(r.finish), r.output, usage_of(usage), info)
    return response, frozenset(r.provenance)


def _usage(usages: list[w.Usage]) -> w.Usage:
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    return w.Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                   prompt_tokens_details=w.PromptTokensDetails(cached_tokens=cached))


def _info(infos: list[w.FakInfo], m: McpPlan) -> dict[str, Any] | None:
    """The turns' ``fak`` extensions as one: every admission, verdict and remedy, in order."""
    if not infos:
        return None
    last = infos[-1]
    merged = last.model_copy(update={
        "admissions": [a for i in infos for a in i.admissions], "tool_calls": [v for i in infos for v in i.tool_calls],
        "remedies": [x for i in infos for x in i.remedies],
        "ignored": sorted({*(n for i in infos for n in i.ignored), *m.ignored})})
    withheld = [w.McpWithheldInfo(server_label=s.label, name=wh.name, change=wh.change)
                for s in m.servers for wh in s.offer.withheld]
    return merged.model_copy(update={"mcp_withheld": withheld}).model_dump()


def events(response: wr.ResponseObject, skeleton: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A finished response told as the Responses events, item by item (see "Streaming")."""
    seq = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return {"type": kind, "sequence_number": seq - 1, **fields}

    yield event("response.created", response=skeleton)
    yield event("response.in_progress", response=skeleton)
    for index, item in enumerate(response.output):
        done = item.model_dump(mode="json")
        base = {"output_index": index, "item_id": item.id}
        if isinstance(item, wr.McpListToolsItem):
            yield event("response.output_item.added", output_index=index, item={**done, "tools": []})
            yield event("response.mcp_list_tools.in_progress", **base)
            yield event("response.mcp_list_tools.failed" if item.error else "response.mcp_list_tools.completed", **base)
        elif isinstance(item, wr.McpCallItem):
            yield event("response.output_item.added", output_index=index,
                        item={**done, "output": None, "error": None, "status": "in_progress"})
            yield event("response.mcp_call.in_progress", **base)
            yield event("response.mcp_call_arguments.delta", **base, delta=item.arguments)
            yield event("response.mcp_call_arguments.done", **base, arguments=item.arguments)
            yield event("response.mcp_call.failed" if item.error else "response.mcp_call.completed", **base)
        elif isinstance(item, wr.FunctionCallItem):
            yield event("response.output_item.added", output_index=index,
                        item={**done, "arguments": "", "status": "in_progress"})
            yield event("response.function_call_arguments.delta", **base, delta=item.arguments)
            yield event("response.function_call_arguments.done", **base, name=item.name, arguments=item.arguments)
        elif isinstance(item, wr.OutputMessage):
            yield event("response.output_item.added", output_index=index,
                        item={**done, "content": [], "status": "in_progress"})
            for ci, part in enumerate(item.content):
                p = part.model_dump(mode="json")
                empty = {**p, "text": ""} if isinstance(part, wr.OutputText) else {**p, "refusal": ""}
                yield event("response.content_part.added", **base, content_index=ci, part=empty)
                if isinstance(part, wr.OutputText):
                    yield event("response.output_text.delta", **base, content_index=ci, delta=part.text, logprobs=[])
                    yield event("response.output_text.done", **base, content_index=ci, text=part.text, logprobs=[])
                else:
                    yield event("response.refusal.delta", **base, content_index=ci, delta=part.refusal)
                    yield event("response.refusal.done", **base, content_index=ci, refusal=part.refusal)
                yield event("response.content_part.done", **base, content_index=ci, part=p)
        else:  # an approval request
            yield event("response.output_item.added", output_index=index, item=done)
        yield event("response.output_item.done", output_index=index, item=done)
    kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
    yield event(kind, response=response.model_dump(mode="json"))
