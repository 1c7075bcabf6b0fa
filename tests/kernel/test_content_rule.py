"""One rule for who reads content (``fak.kernel.session.caller.reads_content``): generated text,
tool-call arguments, tool-result bytes and a chain's instructions are read by the agent keys
that produce them and by admins; an auditor reads decisions, digests and provenance. Checked
on both surfaces through a real server: the REST API (``GET /v1/responses/{id}``,
``GET /v1/refs/{digest}``) and the console (a held call's page)."""

from __future__ import annotations

import html
import json

import pytest
from support.console import hold, sign_in

from fak.api.deps import ROLE_RIGHTS
from fak.api.keys import Role
from fak.kernel.session.caller import Caller, reads_content, reads_held_call

INSTRUCTIONS = "You are a payments assistant. The account PIN is 4711."
PAY = {"type": "function", "name": "pay", "description": "Pay an amount",
       "parameters": {"type": "object", "properties": {"amount": {"type": "integer", "enum": [5]}}, "required": ["amount"],
                      "additionalProperties": False},
       "strict": True}


def test_the_rule_by_role() -> None:
    """Agent and admin read content; an auditor does not (the API maps roles to these rights)."""
    readers = {r for r in (Role.AGENT, Role.AUDITOR, Role.ADMIN) if reads_content(Caller("acme", "k", ROLE_RIGHTS[r]))}
    assert readers == {Role.AGENT, Role.ADMIN}


@pytest.fixture
def stored(world):
    """A stored response with instructions, text or a function call, and its tool result's ref."""
    live = world["live"]
    agent = live.client(live.key("acme", "agent"))
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": "Pay 5.", "tools": [PAY],
            "tool_choice": {"type": "function", "name": "pay"}, "temperature": 0, "max_output_tokens": 160}
    r = agent.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    yield {**world, "response": r.json(), "agent": agent}
    agent.close()


def test_an_auditor_reads_a_stored_responses_decisions_not_its_content(stored) -> None:
    live, mine = stored["live"], stored["response"]
    calls = [o for o in mine["output"] if o["type"] == "function_call"]
    assert calls and all(json.loads(o["arguments"]) for o in calls), json.dumps(mine)[:3000]  # the grammar forced a call
    assert mine["instructions"] == INSTRUCTIONS and not mine["fak"]["content_withheld"]
    with live.client(live.key("acme", "admin")) as admin:
        assert admin.get(f"/v1/responses/{mine['id']}").json() == mine  # admins read content
    with live.client(live.key("acme", "auditor")) as auditor:
        got = auditor.get(f"/v1/responses/{mine['id']}")
        ref = auditor.get(f"/v1/refs/{stored['ref']}")
    assert got.status_code == 200, got.text
    seen = got.json()
    assert seen["fak"]["content_withheld"] is True and seen["instructions"] is None
    assert "4711" not in got.text and INSTRUCTIONS not in got.text
    for o in seen["output"]:
        if o["type"] == "function_call":
            assert o["arguments"] == "" and o["name"] == "pay" and o["call_id"]
        else:
            assert all(p.get("text", "") == "" and p.get("logprobs") is None for p in o["content"])
    # the decisions stay: the verdicts, their rules, findings and audit indexes, the usage
    assert seen["fak"]["tool_calls"] == mine["fak"]["tool_calls"] and seen["usage"] == mine["usage"]
    assert [(o["type"], o.get("call_id")) for o in seen["output"]] == [(o["type"], o.get("call_id"))
                                                                       for o in mine["output"]]
    assert ref.status_code == 403  # tool-result bytes: content too


def test_the_console_shows_a_held_calls_arguments_by_the_same_rule(world) -> None:
    """The console's held-call page and the API answer each role alike: arguments for a role that
    reads a held call (``reads_held_call``: admin, and the approver deciding it), none for one
    that does not (auditor)."""
    live = world["live"]
    call_id = hold(live, world["sid"], world["poison"])
    for role in (Role.AUDITOR, Role.ADMIN, Role.APPROVER):
        b, _r = sign_in(live, live.key("acme", role.value))
        page = html.unescape(b.get(f"/console/tool-calls/held/{call_id}").text)
        assert ('"amount": 5' in page) == reads_held_call(Caller("acme", "k", ROLE_RIGHTS[role])), role
        b.close()
