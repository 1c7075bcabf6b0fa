"""Tool-call authorization on SmolLM2: what ``authorize_tool_call`` costs with 100 refs in
attention.

    python bench/authorize.py [--json PATH] [--refs 100] [--calls 500]
                              [--skip-counterfactual] [--skip-traces]

A session holds ``--refs`` tool results from ten tools (half of them ``untrusted``), so
every decision looks at 100 refs in the attention provenance. Measured, each as p50/p99
over ``--calls`` calls:

* ``decide``: the policy decision alone (``Kernel.authorizer().decide``: rules for the
  tool, trust of each ref's producer, offending refs) — the part that grows with refs;
* ``decide_with_argument_provenance``: the decision for a mail tool whose rules read where
  its arguments came from (``when_args_from``): every leaf value traced through the 100
  refs' texts and the trusted turns (the texts are indexed once per ref; the first
  decision after an admission pays that, reported separately as ``index_ms_100_refs``);
* ``decide_shipped_default_by_schema``: the same context under the packaged default, for a
  tool it knows only by its declared schema (classified once per schema, then the rules
  inferred for it: the cost of the default's floor);
* ``authorize_tool_call``: the whole audited call (session lock, the attention set of
  the live ledger, the producers, the decision, the arguments' keyed digest, the
  ``ToolCallDecision`` audit event appended to the signed log);
* the peer: one ``audit.append`` of the same event alone (its argument provenance
  included), the floor of any decision that is logged before it is acted on.

The calls alternate between a tool a rule blocks (``send_email``: DENY, 50 offending
refs) and one no rule names (``get_weather``: ALLOW).

Then, in the same run: the exact counterfactual's cost against a full re-prefill
(``bench/counterfactual_cost.py``: target <= the suffix share + 0.1, as RECOMPUTE, and
bit-exact to never-saw), and the trace set (``bench/authorize_traces.py``, issue 46: the
base tasks and the field-level, forged-structure, steering and noise tasks, detectors
removed): attack side-effect calls held >= 0.99 and acting user tasks finished with no
person >= 0.75 under ``examples/policies/agent.yaml``; >= 0.95 and >= 0.60 under the shipped
default with no policy file, on the traces renamed as agent frameworks name their tools and
the tools' OpenAI definitions declared to each session; the whole-context rule measured
beside them without a target. The decision-latency targets stay: decide p50 <= 100 us,
decide with argument provenance p50 <= 200 us, the audited call without its log append p50
<= 300 us.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import authorize_traces
import counterfactual_cost
from common import log, parser, report, target

from fak import Kernel, Settings
from fak.kernel.calls.authorize import Authorizer
from fak.kernel.calls.records import decision_event
from fak.kernel.calls.tool_classes import spec_of
from fak.kernel.facade import default_policy_path
from fak.kernel.model.loader import load_model
from fak.policy.policy import load_policy

POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: bench-authorize}
spec:
  defaults: {trust: untrusted}
  tools:
    - {name: "crm_*", trust: internal}
  tool_calls:
    rules:
      - id: no-untrusted-before-send
        tools: [send_email, transfer_money, "shell_*"]
        when_in_attention: {trust: [untrusted]}
        verdict: DENY
      - id: payments-need-a-person
        tools: [transfer_money]
        verdict: CONFIRM
      - id: internal-before-export
        tools: [export_*]
        when_in_attention: {trust: [internal]}
        verdict: CONFIRM
      - id: mail-recipient-from-untrusted
        tools: [send_mail]
        when_args_from: {args: [to, cc, bcc], trust: [untrusted, generated], except_fields: ["*sender"]}
        verdict: CONFIRM
      - id: mail-carries-untrusted-links
        tools: [send_mail]
        when_args_from: {args: [body], trust: [untrusted]}
        verdict: CONFIRM
"""
SEND_MESSAGE = {"type": "function", "function": {
    "name": "send_message", "description": "Send a message to a person.",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string", "format": "email"}, "cc": {"type": "array", "items": {"type": "string"}},
        "subject": {"type": "string"}, "body": {"type": "string"}}, "required": ["to", "body"]}}}
WORDS = ["the", "order", "shipped", "arrived", "customer", "invoice", "meeting", "project", "report", "quarterly", "update", "team", "review"]


def result_text(i: int) -> bytes:
    """A tool result of 150-250 bytes (100 of them fit the 8k context): a JSON mail (a third of them) or a text record."""
    rng = random.Random(i)
    if i % 3 == 0:
        return json.dumps({"sender": f"user{i}@mail.example", "subject": " ".join(rng.choices(WORDS, k=6)),
                           "body": " ".join(rng.choices(WORDS, k=16)) + f" order {1000 + i} total ${i * 13}.50"}).encode()
    return (f"Record {i}: order {1000 + i} shipped on day {i % 28 + 1}. " + " ".join(rng.choices(WORDS, k=16))
            + f" Tracking: https://shop{i}.example.com/o/{i}").encode()
def media_type(i: int) -> str:
    """The JSON mails are admitted as JSON (their fields are field paths: a reply to a sender is
    excused), the records as text."""
    return "application/json" if i % 3 == 0 else "text/plain"


TOOLS = [f"web_fetch_{i}" for i in range(5)] + [f"crm_lookup_{i}" for i in range(5)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=100)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--counterfactual-repeat", type=int, default=3)
    ap.add_argument("--skip-counterfactual", action="store_true")
    ap.add_argument("--skip-traces", action="store_true")
    args = ap.parse_args(argv)
    lm = load_model()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "policy.yaml"
        policy.write_text(POLICY)
        k = Kernel.open(Settings(data_dir=Path(tmp) / "data", policy_path=policy, prefix_cache=False),
                        model=lm, progress=None)
        try:
            ks = k.create_session("bench")
            ks.append("system", "You are an operations assistant. Reports go to ops@example.com.")
            log(f"admitting {args.refs} tool results ...")
            for i in range(args.refs):
                tool = TOOLS[i % len(TOOLS)]
                adm = ks.admit(tool, result_text(i), media_type=media_type(i))
                if not adm.admitted:
                    raise SystemExit(f"result {i} was not admitted ({adm.verdict.rule_id})")
            refs = ks.refs()
            if len(refs) != args.refs:
                raise SystemExit(f"{len(refs)} refs in attention, expected {args.refs}")
            producers = {r: k.producer_of("bench", r) for r in refs}
            auth = k.authorizer()
            deny = auth.decide("send_email", producers)
            if deny.verdict != "DENY" or len(deny.offending) != args.refs // 2:
                raise SystemExit(f"unexpected decision: {deny.verdict} with {len(deny.offending)} offending")

            context = ks.call_context()
            mail = [{"to": "user3@mail.example", "subject": "Re: your order",  # a reply to a mail's sender
                     "body": "Thanks, order 1003 shipped."},
                    {"to": "ops@example.com", "cc": ["user7@mail.example"], "subject": "weekly report",
                     "body": "Orders shipped this week: 1003, 1004. Details: https://shop4.example.com/o/4"}]
            t0 = time.perf_counter()
            first = auth.decide("send_mail", context, mail[0])
            index_s = time.perf_counter() - t0
            if first.verdict != "ALLOW" or auth.decide("send_mail", context, mail[1]).verdict != "CONFIRM":
                raise SystemExit("unexpected argument-provenance decisions")
            log(f"{args.calls} decisions, {args.calls} with argument provenance and {args.calls} audited calls ...")
            with_args = []
            for i in range(args.calls):
                t0 = time.perf_counter()
                auth.decide("send_mail", context, mail[i % 2])
                with_args.append(time.perf_counter() - t0)
            # the shipped default on the same context: a tool it knows only by its schema, classified
            # (cached per schema) and decided by the rules inferred for it
            shipped = Authorizer(load_policy(default_policy_path()))
            spec = spec_of(SEND_MESSAGE)
            if shipped.decide("send_message", context, mail[1], spec=spec).verdict != "CONFIRM":
                raise SystemExit("unexpected decision of the shipped default")
            by_schema = []
            for i in range(args.calls):
                t0 = time.perf_counter()
                shipped.decide("send_message", context, mail[i % 2], spec=spec)
                by_schema.append(time.perf_counter() - t0)
            decide, call, peer = [], [], []
            names = ["send_email", "get_weather"]
            for i in range(args.calls):
                name = names[i % 2]
                t0 = time.perf_counter()
                auth.decide(name, producers)
                decide.append(time.perf_counter() - t0)
            unlogged = []  # the whole call but its log append: context under the lock, decision, digest, event
            for i in range(args.calls):
                name = names[i % 2]
                t0 = time.perf_counter()
                ks.decide_call(name, {"to": "ops@example.com", "n": i}, ks.call_context(), "bench")
                unlogged.append(time.perf_counter() - t0)
            verdicts = set()
            for i in range(args.calls):
                name = names[i % 2]
                t0 = time.perf_counter()
                d = ks.authorize_tool_call(name, {"to": "ops@example.com", "n": i})
                call.append(time.perf_counter() - t0)
                verdicts.add(d.verdict)
                # the same event the call logged (its argument provenance included), logged again
                event = decision_event("bench", ks.id, name, deny.policy_digest, d, "bench")
                t0 = time.perf_counter()
                k.audit.append(event)
                peer.append(time.perf_counter() - t0)
        finally:
            k.close()
    us = 1e6
    results = {
        "refs_in_attention": args.refs,
        "offending_on_deny": len(deny.offending),
        "calls": args.calls,
        "verdicts": sorted(verdicts),
        "decide_us": {"p50": statistics.median(decide) * us, "p99": pct(decide, 0.99) * us},
        "decide_with_argument_provenance_us": {"p50": statistics.median(with_args) * us,
                                               "p99": pct(with_args, 0.99) * us},
        "decide_shipped_default_by_schema_us": {"p50": statistics.median(by_schema) * us,
                                                "p99": pct(by_schema, 0.99) * us},
        "index_ms_100_refs": index_s * 1e3,
        "authorize_tool_call_us": {"p50": statistics.median(call) * us, "p99": pct(call, 0.99) * us},
        "audit_append_alone_us": {"p50": statistics.median(peer) * us, "p99": pct(peer, 0.99) * us},
        "authorize_without_audit_append_us": {"p50": statistics.median(unlogged) * us,
                                               "p99": pct(unlogged, 0.99) * us},
        "authorize_minus_audit_append_p50_us": (statistics.median(call) - statistics.median(peer)) * us,
        "ratio_call_to_audit_append_p50": statistics.median(call) / statistics.median(peer),
    }
    targets = [
        target("decide p50 with 100 refs (us)", results["decide_us"]["p50"], 100, "<="),
        target("decide with argument provenance p50, 100 refs (us)",
               results["decide_with_argument_provenance_us"]["p50"], 200, "<="),
        target("decide under the shipped default, a tool known by its schema, p50 (us)",
               results["decide_shipped_default_by_schema_us"]["p50"], 200, "<="),
        # the decision (argument provenance included, <= 200 us) plus the session lock, the
        # arguments' keyed digest and the event, measured directly (the difference of two
        # medians, reported too, is as noisy as the append): what a call costs besides its
        # write-ahead log append. (The whole audited call's old <= 100 us target is retired: the
        # append alone is several hundred us, and a decision is logged before it is answered.)
        target("authorize_tool_call p50, audit append excluded (us)",
               results["authorize_without_audit_append_us"]["p50"], 300, "<="),
    ]
    if not args.skip_counterfactual:
        log("the counterfactual's cost (bench/counterfactual_cost.py) ...")
        cf = counterfactual_cost.measure(lm, repeat=args.counterfactual_repeat)
        results["counterfactual"] = cf
        targets += [target(f"counterfactual / full re-prefill (<= suffix share {cf['suffix_share']:.2f} + 0.1)",
                           cf["ratio"], cf["suffix_share"] + 0.1, "<="),
                    target("counterfactual bit-exact to never-saw", float(cf["bit_exact_to_never_saw"]), 1.0, ">=")]
    if not args.skip_traces:
        log("the trace set (bench/authorize_traces.py) ...")
        tr = authorize_traces.measure()
        results["traces"] = tr
        targets += authorize_traces.targets(tr)
    for name, value in (("decide", results["decide_us"]),
                        ("decide, argument provenance", results["decide_with_argument_provenance_us"]),
                        ("decide, shipped default by schema", results["decide_shipped_default_by_schema_us"]),
                        ("authorize_tool_call", results["authorize_tool_call_us"]),
                        ("the same, unlogged", results["authorize_without_audit_append_us"]),
                        ("audit.append alone", results["audit_append_alone_us"])):
        log(f"{name:<22} p50 {value['p50']:9.1f} us   p99 {value['p99']:9.1f} us")
    report("authorize", results, targets, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
