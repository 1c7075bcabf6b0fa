"""Tool classes (``fak.kernel.calls.tool_classes``): tools named and shaped as real frameworks
write them are read as read or side effect with their routing arguments, operators' classes
override, the inferred rules are agent.yaml's for that tool and load as a policy, and ``fak
policy explain-tools`` prints both."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from fak.cli import main
from fak.errors import InvalidInput
from fak.kernel.calls.tool_classes import (
    PARTY_FIELDS,
    ToolClass,
    classify,
    inferred_rules,
    number_paths,
    spec_of,
    words,
)
from fak.policy.policy import load_policy_text
from fak.policy.schema import ToolCallRule, ToolClassEntry

S = {"type": "string"}


def tool(name: str, description: str = "", /, **props: Any) -> dict[str, Any]:
    """An OpenAI chat-completions tool (its properties may be called ``name`` or ``description``)."""
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": props}}}


def of(t: dict[str, Any]) -> ToolClass:
    spec = spec_of(t)
    return classify(spec.name, spec)


def ids(cls: ToolClass) -> list[str]:
    return [r.id for r in inferred_rules(cls)]


@pytest.mark.parametrize(("name", "expected"), [
    ("send_message", ["send", "message"]),
    ("slack_chat_postMessage", ["slack", "chat", "post", "message"]),
    ("GMAIL_SEND_EMAIL", ["gmail", "send", "email"]),
    ("gmail.send_message", ["gmail", "send", "message"]),
    ("mcp__filesystem__write_file", ["mcp", "filesystem", "write", "file"]),
    ("HTTPRequest", ["http", "request"]),
])
def test_names_split_into_words_as_frameworks_write_them(name: str, expected: list[str]) -> None:
    assert words(name) == expected


@pytest.mark.parametrize(("t", "effect", "routing", "content"), [
    (tool("send_message", to=S, text=S), "side_effect", {"to": "recipient"}, ["text"]),
    (tool("pay_invoice", iban=S, amount={"type": "number"}), "side_effect", {"iban": "account", "amount": "amount"},
     []),
    (tool("fetch", url=S), "read", {"url": "url"}, []),
    (tool("run", command=S), "side_effect", {"command": "command"}, []),
    (tool("GMAIL_SEND_EMAIL", recipient_email=S, subject=S, body=S), "side_effect",
     {"recipient_email": "recipient"}, ["subject", "body"]),
    (tool("slack_chat_postMessage", channel=S, text=S), "side_effect", {"channel": "channel"}, ["text"]),
    (tool("chat_postMessage", channel=S, text=S), "side_effect", {"channel": "channel"}, ["text"]),
    (tool("mcp__filesystem__write_file", path=S, content=S), "side_effect", {"path": "path"}, ["content"]),
    (tool("get_weather", city=S), "read", {}, []),
    (tool("frobnicate", x=S), "side_effect", {}, []),
    (tool("stripe_create_payout", destination=S, amount={"type": "integer"}), "side_effect",
     {"destination": "account", "amount": "amount"}, []),
    (tool("github__create_issue", repo=S, title=S, body=S), "side_effect", {}, ["body"]),
    (tool("send_direct_message", user_id=S, message=S), "side_effect", {"user_id": "channel"}, ["message"]),
    (tool("send_sms", phone_number=S, text=S), "side_effect", {"phone_number": "phone"}, ["text"]),
    (tool("transfer_money", to=S, amount={"type": "number"}), "side_effect", {"to": "account", "amount": "amount"},
     []),
    (tool("download_file", url=S, path=S), "side_effect", {"url": "url", "path": "path"}, []),
    (tool("submit_form", action=S), "side_effect", {"action": "url"}, []),
    (tool("execute_code", code=S, language=S), "side_effect", {"code": "command"}, []),
    (tool("book_flight", destination=S, email=S), "side_effect", {"email": "recipient"}, []),  # a city routes nothing
    (tool("gmail_message_get", id=S), "read", {}, []),  # resource first, then the verb
    (tool("get_post", post_id=S), "read", {}, []),
    (tool("search_and_delete_files", pattern=S), "side_effect", {}, []),
    (tool("weather", "Returns the weather for a city.", city=S), "read", {}, []),
    (tool("weather_alert", "This is a tool that sends the forecast to a phone.", phone=S), "side_effect",
     {"phone": "phone"}, []),
])
def test_tools_of_real_frameworks_are_classified(t: dict[str, Any], effect: str, routing: dict[str, str],
                                                 content: list[str]) -> None:
    cls = of(t)
    assert (cls.effect, dict(cls.routing), list(cls.content), cls.basis) == (effect, routing, content, "schema")
    assert cls.reasons[0].startswith(f"effect {effect}:")
    for path, kind in routing.items():
        assert any(r.startswith(f"{path}: {kind} (") for r in cls.reasons), cls.reasons


def test_format_routes_a_property_whatever_its_name() -> None:
    cls = of(tool("notify", dest={"type": "string", "format": "email"}, site={"type": "string", "format": "uri"},
                  when={"type": "string", "format": "date-time"}))
    assert dict(cls.routing) == {"dest": "recipient", "site": "url"}
    assert "dest: recipient (format email)" in cls.reasons
    # an Optional[...] property (anyOf with null) and a list whose items carry the format
    cls = of(tool("send_email", extra={"anyOf": [{"type": "array", "items": {"type": "string", "format": "email"}},
                                                 {"type": "null"}]},
                  copies={"type": "array", "items": {"type": "string", "format": "email"}}))
    assert dict(cls.routing) == {"extra": "recipient", "copies": "recipient"}
    # the property's description when neither its name nor a format says
    cls = of(tool("notify", target={"type": "string", "description": "The e-mail of whoever is told"}))
    assert dict(cls.routing) == {"target": "recipient"}


def test_nested_objects_and_lists_of_objects_give_paths() -> None:
    cls = of(tool("send_money", recipient=S, payment={"type": "object", "properties": {
        "iban": S, "amount": {"type": "number"}, "reference": S}}))
    assert dict(cls.routing) == {"recipient": "account", "payment.iban": "account", "payment.amount": "amount"}
    assert number_paths(cls) == ("recipient", "payment.iban", "payment.amount")
    cls = of(tool("create_event", title=S, description=S, attendees={"type": "array", "items": {
        "type": "object", "properties": {"email": S, "display_name": S, "optional": {"type": "boolean"}}}}))
    assert dict(cls.routing) == {"attendees.*.email": "recipient"}
    assert cls.content == ("description",)
    # a list of strings is its own path: ``to`` covers ``to.0``, ``to.1``
    assert dict(of(tool("send_email", to={"type": "array", "items": S})).routing) == {"to": "recipient"}


def test_a_pydantic_schema_with_defs_is_resolved() -> None:
    class Party(BaseModel):
        name: str
        email: str

    class Invite(BaseModel):
        organizer: Party
        guests: list[Party]
        note: str | None = None

    cls = of({"name": "invite_people", "parameters": Invite.model_json_schema()})
    assert dict(cls.routing) == {"organizer.email": "recipient", "guests.*.email": "recipient"}
    assert cls.content == ("note",)


def test_an_operator_class_overrides_what_it_sets() -> None:
    spec = spec_of(tool("notify", target=S, text=S))
    assert dict(classify("notify", spec).routing) == {}  # a target of no file or payment tool routes nothing
    entries = [ToolClassEntry(tools=["other"], effect="read"),
               ToolClassEntry(tools=["noti*"], routing={"target": "recipient"}),
               ToolClassEntry(tools=["notify"], effect="read")]  # not the first that matches: unused
    cls = classify("notify", spec, overrides=entries)
    assert (cls.effect, dict(cls.routing), cls.content, cls.basis) == ("side_effect", {"target": "recipient"},
                                                                       ("text",), "policy")
    assert cls.reasons[-1] == "policy class ['noti*']: sets routing"
    assert "inferred:recipient-not-from-user" in ids(cls)
    read = classify("fetch_page", spec_of(tool("fetch_page", url=S)),
                    overrides=[ToolClassEntry(tools=["fetch_*"], effect="side_effect", content=["body"])])
    assert (read.effect, read.content) == ("side_effect", ("body",))


def test_without_a_schema_the_argument_names_classify_and_without_them_the_name() -> None:
    cls = classify("send_message", args={"to": ["a@example.com"], "text": "hi", "meta": {"link": "x", "n": 3},
                                         "cards": [{"iban": "DE00"}], "urgent": True})
    assert cls.basis == "arguments"
    assert dict(cls.routing) == {"to": "recipient", "meta.link": "url", "cards.*.iban": "account"}
    assert cls.content == ("text",)
    # arguments as the JSON text a client sends
    assert dict(classify("notify", args=json.dumps({"email": "x"})).routing) == {"email": "recipient"}
    # values never classify: the class does not move with what a call writes
    assert dict(classify("notify", args={"x": "evil@example.com"}).routing) == {}
    bare = classify("send_message")
    assert (bare.effect, bare.routing, bare.basis) == ("side_effect", (), "name")
    assert classify("list_files", args={}).effect == "read"
    # a schema that declares no argument: the call's names are read instead
    assert classify("ping_user", spec_of({"name": "ping_user"}), {"user": "u1"}).routing == (("user", "channel"),)


def test_spec_of_reads_the_three_shapes_and_refuses_others() -> None:
    schema = {"type": "object", "properties": {"to": S}}
    shapes = [{"type": "function", "function": {"name": "send", "description": "d", "parameters": schema}},
              {"name": "send", "description": "d", "parameters": schema},  # a bare function, a Responses tool
              {"type": "function", "name": "send", "description": "d", "parameters": schema},
              {"name": "send", "description": "d", "inputSchema": schema},  # MCP tools/list
              {"name": "send", "description": "d", "input_schema": schema}]  # Anthropic
    for shape in shapes:
        spec = spec_of(shape)
        assert (spec.name, spec.description, spec.parameters) == ("send", "d", schema), shape
    assert spec_of({"name": "ping"}).parameters == {"type": "object", "properties": {}}
    for bad in [{"type": "web_search"}, {"description": "no name"}, {"name": 3}, {"name": "bad name!"},
                {"name": "x", "inputSchema": "not a schema"}, {"type": "function", "function": "x"}]:
        with pytest.raises(InvalidInput):
            spec_of(bad)
    with pytest.raises(InvalidInput, match="JSON object"):
        spec_of(["send"])  # type: ignore[arg-type]


def _rule(cls: ToolClass, rule_id: str) -> ToolCallRule:
    return next(r for r in inferred_rules(cls) if r.id == rule_id)


def test_inferred_rules_mirror_agent_yaml_for_the_tool() -> None:
    send = of(tool("send_message", to=S, text=S))
    assert ids(send) == ["inferred:side-effect", "inferred:endorsed-by-untrusted", "inferred:recipient-not-from-user",
                         "inferred:recipient-from-internal-free-text", "inferred:untrusted-routing-in-body"]
    steer = _rule(send, "inferred:endorsed-by-untrusted").when_endorsed
    assert steer is not None and "text" in steer.args and "to" not in steer.args and steer.by == ["untrusted"]
    for rule in inferred_rules(send):
        assert rule.tools == ["send_message"]
        assert ToolCallRule.model_validate(rule.model_dump()) == rule  # plain policy rules
    new = _rule(send, "inferred:recipient-not-from-user")
    assert new.verdict == "CONFIRM" and new.when_args_from is not None
    (match,) = new.when_args_from
    assert (match.args, match.trust, match.except_fields) == (["to"], ["untrusted", "generated"], PARTY_FIELDS)
    # a reply is excused only by the results of read tools that name parties, never this tool's own
    excusers = match.except_tools
    assert "*" not in excusers
    assert not any(fnmatchcase("send_message", g) for g in excusers)
    for reader in ("read_channel_messages", "get_unread_emails", "search_events", "GMAIL_FETCH_EMAILS",
                   "slack_conversations_history", "read_sms"):
        assert any(fnmatchcase(reader, g) for g in excusers), reader
    assert not any(fnmatchcase(web, g) for g in excusers for web in ("get_webpage", "fetch", "search_web"))
    body = _rule(send, "inferred:untrusted-routing-in-body").when_args_from
    assert body is not None and [m.args for m in body] == [["to"], ["text"]]
    assert body[1].trust == ["untrusted"] and body[1].entities_only
    # a payment: the payee, never the amount
    pay = of(tool("pay_invoice", iban=S, amount={"type": "number"}))
    assert ids(pay) == ["inferred:side-effect", "inferred:endorsed-by-untrusted", "inferred:payee-not-from-user",
                        "inferred:payee-from-record-text"]
    assert all(m.args == ["iban"] for r in inferred_rules(pay) for m in r.when_args_from or ())
    # a URL read: only a composed one needs a person; posted to: any the user did not give
    (_, composed) = inferred_rules(of(tool("fetch", url=S)))
    assert composed.when_args_from is not None and composed.when_args_from[0].trust == ["generated"]
    post = _rule(of(tool("post_webpage", url=S, content=S)), "inferred:destination-not-from-user")
    assert post.when_args_from is not None and post.when_args_from[0].trust == ["untrusted", "generated"]
    # shell: copied from untrusted text is refused, composed after it needs a person
    shell = inferred_rules(of(tool("run", command=S)))
    assert [(r.id, r.verdict) for r in shell] == [
        ("inferred:side-effect", "ALLOW"), ("inferred:endorsed-by-untrusted", "CONFIRM"),
        ("inferred:command-from-untrusted", "DENY"),
        ("inferred:command-value-from-tool-output", "CONFIRM"), ("inferred:command-composed-after-untrusted", "CONFIRM")]
    assert shell[4].when_in_attention is not None and shell[4].when_in_attention.trust == ["untrusted"]
    # nothing to trace: allowed; a credential: always a person
    assert [(r.id, r.verdict) for r in inferred_rules(of(tool("frobnicate", x=S)))] == [
        ("inferred:side-effect", "ALLOW"), ("inferred:endorsed-by-untrusted", "CONFIRM")]
    assert [(r.id, r.verdict) for r in inferred_rules(of(tool("get_weather", city=S)))] == [("inferred:read", "ALLOW")]
    assert [(r.id, r.verdict) for r in inferred_rules(of(tool("update_password", password=S)))] == [
        ("inferred:side-effect", "ALLOW"), ("inferred:credential-change", "CONFIRM"),
        ("inferred:endorsed-by-untrusted", "CONFIRM")]
    assert "inferred:credential-change" not in ids(of(tool("get_api_key", service=S)))  # reading is no change


def test_inferred_rules_load_as_a_policy() -> None:
    tools = [tool("send_message", to=S, text=S), tool("pay_invoice", iban=S, amount={"type": "number"}),
             tool("fetch", url=S), tool("run", command=S), tool("mcp__filesystem__write_file", path=S, content=S),
             tool("reset_password", user=S)]
    rules = [r.model_dump(mode="json", exclude_defaults=True) for t in tools for r in inferred_rules(of(t))]
    for n, rule in enumerate(rules):
        rule["id"] = f"{rule['id']}-{n}"  # one policy: ids are unique across tools
    doc = {"apiVersion": "fak.dev/v1", "kind": "Policy", "metadata": {"name": "inferred"},
           "spec": {"tool_calls": {"unlisted": "CONFIRM", "rules": rules}}}
    policy = load_policy_text(json.dumps(doc), "inferred.yaml")  # JSON is YAML
    assert len(policy.spec.tool_calls.rules) == len(rules) > 15


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["type", "properties", "items", "anyOf", "$ref", "format", "to", "url", "x",
                                         "allOf", "description"]), inner, max_size=5), max_leaves=30))
def test_any_json_as_a_schema_or_arguments_classifies_without_error(junk: Any) -> None:
    for parameters in (junk, {"type": "object", "properties": junk}):
        if isinstance(parameters, dict):
            cls = classify("send_x", spec_of({"name": "send_x", "parameters": parameters}))
            inferred_rules(cls)
            json.dumps(cls.as_dict())
    inferred_rules(classify("send_x", args=junk))


def test_explain_tools_prints_classes_and_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": [
        tool("send_message", to=S, text=S)["function"] | {"inputSchema": {"type": "object",
                                                                          "properties": {"to": S, "text": S}}},
        {"type": "web_search"},
        {"name": "get_weather", "inputSchema": {"type": "object", "properties": {"city": S}}}]}))
    assert main(["policy", "explain-tools", str(tools)]) == 0
    out, err = capsys.readouterr()
    assert "send_message: side_effect (from the schema)" in out and "routing: to=recipient" in out
    assert "inferred:recipient-not-from-user CONFIRM when to from untrusted/generated" in out
    assert "get_weather: read" in out and "inferred:read ALLOW" in out
    assert "tools[1]: skipped" in err
    assert main(["policy", "explain-tools", str(tools), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["tools"]
    assert [(t["tool"], t["effect"], t["rules_from"]) for t in report] == [
        ("send_message", "side_effect", "inferred"), ("get_weather", "read", "inferred")]
    assert report[0]["routing"] == {"to": "recipient"} and report[0]["rules"][2]["id"] == "inferred:recipient-not-from-user"
    # with a policy: its own rules for a tool they name; the others by from_schemas (off here)
    policy = tmp_path / "p.yaml"
    policy.write_text("apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n  tool_calls:\n"
                      "    unlisted: CONFIRM\n    classes: [{tools: [get_*], effect: side_effect}]\n"
                      "    rules: [{id: mine, tools: [send_*], verdict: ALLOW}]\n")
    assert main(["policy", "explain-tools", str(tools), "--policy", str(policy), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["tools"]
    assert [(t["rules_from"], [r["id"] for r in t["rules"]], t["unlisted"]) for t in report] == [
        ("policy", ["mine"], "CONFIRM"), ("none", [], "CONFIRM")]
    assert (report[1]["effect"], report[1]["basis"]) == ("side_effect", "policy")
    assert main(["policy", "explain-tools", str(tools), "--policy", str(policy)]) == 0
    assert "unlisted decides (CONFIRM)" in capsys.readouterr().out
    # not a tool list: a clear error, exit 1
    (tmp_path / "bad.json").write_text('{"functions": []}')
    assert main(["policy", "explain-tools", str(tmp_path / "bad.json")]) == 1
    assert '"tools" list' in capsys.readouterr().err


def test_policy_validate_is_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "p.yaml"
    good.write_text("apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec: {}\n")
    assert main(["policy", "validate", str(good)]) == 0
    assert ": ok p " in capsys.readouterr().out
    good.write_text("apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: p}\nspec: {nope: 1}\n")
    assert main(["policy", "validate", str(good)]) == 1
