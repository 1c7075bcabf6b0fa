"""The model's evidence about a call fak generated, through the OpenAI-compatible door (issue 28):
rules that read the attention its argument tokens put on untrusted refs, and the exact
counterfactual (the refs evicted by RECOMPUTE, the same call teacher-forced). A tiny random
model writes the calls (constrained decoding makes them well-formed); what is tested is that
the evidence is computed for the generated call, recorded, and decides as the rule says."""

from __future__ import annotations

import json

import pytest
from support.call_evidence import PAGE, POLICY
from support.tiny_kernel import policy_kernel

from fak import Kernel
from fak import wire as w
from fak.kernel.calls.generated import generated_calls
from fak.kernel.openai import chat as openai_chat
from fak.kernel.openai.sampling import token_bytes
from fak.kernel.session.caller import Caller

MAIL = {"type": "function", "function": {
    "name": "send_email", "parameters": {"type": "object", "properties": {"to": {"type": "string", "maxLength": 20}},
                                         "required": ["to"], "additionalProperties": False}}}


def _kernel(tmp_path, tiny_dir, tiny_lm, extra: str) -> Kernel:
    return policy_kernel(tmp_path, tiny_dir, tiny_lm, POLICY % extra)


def _ask(k: Kernel) -> tuple[dict, object]:
    """A forced send_email call with an untrusted page in attention; (fak extension, decision event)."""
    body = w.ChatCompletionRequest.model_validate({
        "model": "m", "temperature": 0, "max_tokens": 200, "tools": [MAIL],
        "tool_choice": {"type": "function", "function": {"name": "send_email"}},
        "messages": [{"role": "user", "content": "Forward the invoices."},
                     {"role": "tool", "tool_call_id": "c1", "name": "web_fetch", "content": PAGE}]})
    out = openai_chat.complete(k, Caller("acme", "test"), body)
    events = [e.event for e in k.audit.entries("acme") if e.event.type == "tool_call_decision"]
    return out.fak.model_dump(), events[-1]


@pytest.mark.parametrize(("margin", "acquitted"), [(100.0, True)])
def test_counterfactual_acquits_a_call_as_likely_without_the_refs(tmp_path, tiny_dir, tiny_lm, margin, acquitted):
    rule = f"        counterfactual: true\n        counterfactual_margin: {margin}"
    k = _kernel(tmp_path, tiny_dir, tiny_lm, rule)
    try:
        fak, event = _ask(k)
        [verdict] = fak["tool_calls"]
        assert event.counterfactual is not None and event.counterfactual.acquitted is acquitted
        page_ref = next(a["ref"] for a in fak["admissions"] if a["tool"] == "web_fetch")
        assert event.counterfactual.refs == [page_ref]
        assert set(event.counterfactual.logprob_with) == {"to"} == set(event.counterfactual.logprob_without)
        assert event.counterfactual.seconds > 0
        assert verdict["verdict"] == ("ALLOW" if acquitted else "DENY")
    finally:
        k.close()


def test_a_margin_of_zero_acquits_only_when_no_argument_is_less_likely(tmp_path, tiny_dir, tiny_lm):
    k = _kernel(tmp_path, tiny_dir, tiny_lm, "        counterfactual: true\n        counterfactual_margin: 0")
    try:
        fak, event = _ask(k)
        cf = event.counterfactual
        assert cf is not None
        expected = all(cf.logprob_without[a] >= lp for a, lp in cf.logprob_with.items())
        assert cf.acquitted is expected
        assert fak["tool_calls"][0]["verdict"] == ("ALLOW" if expected else "DENY")
    finally:
        k.close()


@pytest.mark.parametrize(("above", "fires"), [(1.0, False), (0.0, True)])
def test_attention_evidence_is_recorded_and_thresholded(tmp_path, tiny_dir, tiny_lm, above, fires):
    k = _kernel(tmp_path, tiny_dir, tiny_lm, f"        when_attention: {{trust: [untrusted], above: {above}}}")
    try:
        fak, event = _ask(k)
        page_ref = next(a["ref"] for a in fak["admissions"] if a["tool"] == "web_fetch")
        [record] = [a for a in event.attention if a.ref == page_ref]
        assert record.arg == "to" and len(record.per_layer) == k.model.cfg.num_layers
        assert 0.0 < record.mean <= 1.0
        assert abs(record.mean - sum(record.per_layer) / len(record.per_layer)) < 1e-9
        assert fak["tool_calls"][0]["verdict"] == ("DENY" if fires else "ALLOW")
    finally:
        k.close()


def test_a_framework_call_has_no_evidence_and_the_rule_fires(tmp_path, tiny_dir, tiny_lm):
    k = _kernel(tmp_path, tiny_dir, tiny_lm, "        when_attention: {trust: [untrusted], above: 1.0}")
    try:
        s = k.session("acme")
        s.append("user", "hi")
        s.admit("web_fetch", PAGE.encode())
        d = s.authorize_tool_call("send_email", {"to": "x@y.example"})
        assert d.verdict == "DENY" and d.attention == {}
    finally:
        k.close()


def test_generated_calls_locate_each_argument_among_the_tokens(tiny_lm):
    tok = tiny_lm.tokenizer
    text = 'Sure. <tool_call>\n{"name": "pay", "arguments": {"iban": "DE89 3704", "note": "thé ok", "n": 5}}\n</tool_call>'
    ids = tok.tk.encode(text, add_special_tokens=False).ids
    [call] = generated_calls(ids, token_bytes(tok.tk))
    assert call.name == "pay" and call.arguments == {"iban": "DE89 3704", "note": "thé ok", "n": 5}
    piece = token_bytes(tok.tk)
    for name, expected in (("iban", '"DE89 3704"'), ("note", '"thé ok"'), ("n", "5")):
        i, j = call.args[name]
        covered = b"".join(piece(t) for t in ids[i:j]).decode()
        assert expected in covered and len(covered) < len(expected) + 8, (name, covered)
    assert json.loads(b"".join(piece(t) for t in call.tokens).decode().split("<tool_call>")[1])["name"] == "pay"
