"""The approvals walk through REST (docs/approvals.md), against a real server on the tiny model
(greedy decode): a call the policy holds in an ephemeral session, the application learning that
it waits (``GET /v1/tool-calls?state=pending``), who may and may not decide it, a person's
approval, and the call released once: its result admitted under the held id in a later
ephemeral session (the chat path, where the application runs the tool), or run by fak itself,
once, from a resent history (the Responses ``mcp`` path with ``store: false``)."""

from __future__ import annotations

import json

import pytest
from support.mcp_servers import MailServer, running
from support.tiny_kernel import served

POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: approvals-walk}
spec:
  defaults: {trust: untrusted}
  tool_calls:
    rules:
      - {id: payments-need-a-person, tools: [pay], verdict: CONFIRM}
      - {id: reading-mail-needs-a-person, tools: ["mcp:mail/read_inbox"], verdict: CONFIRM}
"""
PAY = {"type": "function", "function": {"name": "pay", "parameters": {
    "type": "object", "properties": {"iban": {"enum": ["DE89370400440532013000"]}}, "required": ["iban"],
    "additionalProperties": False}}}
USER = [{"role": "user", "content": "Pay the invoice."}]
TURN = {"model": "m", "tools": [PAY], "tool_choice": "required", "temperature": 0, "max_tokens": 160}


def _events(kernel, kind: str) -> list:
    return [e.event for e in kernel.audit.entries("acme") if e.event.type == kind]


def test_the_approvals_walk_through_rest_with_a_held_call_in_an_ephemeral_session(tmp_path, tiny_dir, tiny_lm):
    with served(tmp_path, tiny_dir, tiny_lm, POLICY) as fak:
        live = fak.live
        approver, other_tenant = live.key("acme", "approver"), live.key("globex", "approver")
        with live.client(fak.key) as agent, live.client(approver) as person, live.client(other_tenant) as globex:
            # 1. the agent's request: the call is held, and withheld from a client that runs what it gets
            r = agent.post("/v1/chat/completions", json={**TURN, "messages": USER})
            assert r.status_code == 200, r.text
            answer = r.json()
            [v] = answer["fak"]["tool_calls"]
            held, sid = v["id"], answer["fak"]["session_id"]
            assert v["verdict"] == "CONFIRM" and v["held"] and not v["returned"] and held.startswith("call_held_")
            assert answer["choices"][0]["message"].get("tool_calls") is None and held in r.headers["fak-tool-calls"]
            assert answer["fak"]["ephemeral"] and agent.get(f"/v1/sessions/{sid}").status_code == 404  # gone with it

            # 2. the application learns that it waits: the tenant's pending queue, with an approver key
            pending = person.get("/v1/tool-calls", params={"state": "pending"})
            assert pending.status_code == 200, pending.text
            [call] = pending.json()["data"]
            assert (call["id"], call["state"], call["session_id"], call["rule_id"]) == (
                held, "pending", sid, "payments-need-a-person")
            assert call["tool_call"]["function"]["name"] == "pay" and call["decision_audit_index"] == v["audit_index"]
            arguments = call["tool_call"]["function"]["arguments"]
            assert json.loads(arguments) == {"iban": "DE89370400440532013000"}
            assert person.get(f"/v1/tool-calls/{held}").json()["produced_by"] == call["produced_by"]

            # 3. who may not decide: the agent's own key (its role, and it produced the call), another tenant
            assert agent.get("/v1/tool-calls").status_code == 403
            assert agent.post(f"/v1/tool-calls/{held}/approve").status_code == 403
            assert globex.get("/v1/tool-calls").json()["data"] == []
            assert globex.get(f"/v1/tool-calls/{held}").status_code == 404
            assert globex.post(f"/v1/tool-calls/{held}/approve").status_code == 404

            # until a person approves, the call's result cannot enter a conversation
            resent = [*USER, {"role": "assistant", "content": None, "tool_calls": [
                {"id": held, "type": "function", "function": {"name": "pay", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": held, "content": "paid: transfer 4711"}]
            early = agent.post("/v1/chat/completions", json={"model": "m", "messages": resent, "max_tokens": 8,
                                                             "temperature": 0})
            assert early.status_code == 409 and early.json()["error"]["code"] == "tool_call_held"

            # 4. a person approves: once (the same decision again changes nothing, the other one is refused)
            ok = person.post(f"/v1/tool-calls/{held}/approve")
            assert ok.status_code == 200, ok.text
            assert ok.json()["state"] == "approved" and ok.json()["decided_by"] != call["produced_by"]
            assert person.post(f"/v1/tool-calls/{held}/approve").json()["audit_index"] == ok.json()["audit_index"]
            assert person.post(f"/v1/tool-calls/{held}/reject").status_code == 409
            assert person.get("/v1/tool-calls").json()["data"] == []
            assert [c["id"] for c in person.get("/v1/tool-calls", params={"state": "approved"}).json()["data"]] == [held]

            # 5. the agent runs the tool itself and sends its result under the held id, in a new ephemeral session
            after = agent.post("/v1/chat/completions", json={"model": "m", "messages": resent, "max_tokens": 8,
                                                             "temperature": 0})
            assert after.status_code == 200, after.text
            [admitted] = [a for a in after.json()["fak"]["admissions"] if a["tool_call_id"] == held]
            assert admitted["verdict"] == "ALLOW" and after.json()["fak"]["session_id"] != sid
            assert fak.kernel.store.get(admitted["ref"], "acme") == b"paid: transfer 4711"

        # the log: the decision that held it, and one approval naming the person's key
        decisions = [d for d in _events(fak.kernel, "tool_call_decision") if d.tool == "pay"]
        assert [d.verdict for d in decisions] == ["CONFIRM"]
        approvals = _events(fak.kernel, "tool_call_approval")
        assert [(a.call_id, a.approved, a.decision_index) for a in approvals] == [(held, True, v["audit_index"])]
        assert str(approvals[0].principal) == ok.json()["decided_by"]


def test_the_key_that_produced_a_held_call_cannot_approve_it_whatever_its_role(tmp_path, tiny_dir, tiny_lm):
    with served(tmp_path, tiny_dir, tiny_lm, POLICY) as fak:
        admin = fak.live.key("acme", "admin")
        with fak.live.client(admin) as c:
            r = c.post("/v1/chat/completions", json={**TURN, "messages": USER})
            held = r.json()["fak"]["tool_calls"][0]["id"]
            refused = c.post(f"/v1/tool-calls/{held}/approve")
            assert refused.status_code == 403 and "produced" in refused.json()["detail"]
            assert c.post(f"/v1/tool-calls/{held}/reject").json()["state"] == "rejected"  # rejecting runs nothing


@pytest.fixture
def mail():
    with running(MailServer()) as srv:
        yield srv


def test_a_held_mcp_call_of_a_stateless_chain_runs_once_fak_runs_it_after_approval(tmp_path, tiny_dir, tiny_lm, mail):
    """``store: false``: the held call's session is gone with its response; the agent resends the
    history with its approval, and fak runs the call (the arguments it held) once."""
    from fak import Kernel, Settings
    from fak.api.server import serve

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    k = Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, policy_path=policy,
                             mcp_servers={"mail": {"url": mail.url, "timeout_s": 5}}), model=tiny_lm, progress=None)
    k.services.mcp.approve("mail", "operator-test")
    tool = {"type": "mcp", "server_label": "mail", "server_url": mail.url, "require_approval": "never"}
    try:
        with serve(k) as live, live.client(live.key("acme", "agent")) as agent, \
                live.client(live.key("acme", "approver")) as person:
            ask = {"model": "fak", "store": False, "temperature": 0, "max_output_tokens": 160, "tools": [tool]}
            r = agent.post("/v1/responses", json={**ask, "input": "What is in my inbox?",
                                                  "tool_choice": {"type": "mcp", "server_label": "mail",
                                                                  "name": "read_inbox"}})
            assert r.status_code == 200, r.text
            request = next(o for o in r.json()["output"] if o["type"] == "mcp_approval_request")
            assert request["id"].startswith("call_held_") and mail.mail.reads == 0
            assert [c["id"] for c in person.get("/v1/tool-calls").json()["data"]] == [request["id"]]
            history = [{"role": "user", "content": "What is in my inbox?"}, request,
                       {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}]
            resume = {**ask, "input": history, "max_output_tokens": 8}
            assert agent.post("/v1/responses", json=resume).status_code == 403  # the agent cannot approve it itself
            assert mail.mail.reads == 0
            assert person.post(f"/v1/tool-calls/{request['id']}/approve").status_code == 200
            done = agent.post("/v1/responses", json=resume)
            assert done.status_code == 200, done.text
            call = next(o for o in done.json()["output"] if o["type"] == "mcp_call")
            assert call["approval_request_id"] == request["id"] and call["error"] is None and mail.mail.reads == 1
            again = agent.post("/v1/responses", json=resume)  # the same approval resent: nothing runs again
            assert again.status_code == 409 and mail.mail.reads == 1
        called = [e for e in _events(k, "mcp_tool_called") if e.tool == "mcp:mail/read_inbox"]
        assert [(c.call_id, c.outcome) for c in called] == [(request["id"], "ok")]
    finally:
        k.close()
