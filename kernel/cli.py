"""``fak chat``, ``fak sessions``, ``fak forget``, ``fak quarantine``, ``fak erase-tenant`` and ``fak demo``: the
Kernel from a terminal (in process, on the data directory the settings name). Those that open a Kernel refuse, naming the
pid, while ``fak serve`` (or another Kernel) runs on that data directory (``fak.owner``); ``fak sessions``
only reads the database and works beside it. ``fak policy explain-tools`` (added to the policy layer's commands, which
may not import the kernel) shows how the tool classes read an agent's tool schemas; ``fak policy authorize`` judges a
tool call offline against a policy and a context file, as ``fak gate`` judges admissions."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from fak.cli_options import POLICY_HELP, add_config

if TYPE_CHECKING:
    from fak.kernel.calls.authorize import Authorizer, ToolCallDecision
    from fak.kernel.calls.provenance import ArgumentTrace, ValueSource
    from fak.kernel.calls.tool_classes import ToolClass
    from fak.kernel.calls.tool_text import ToolSpec
    from fak.kernel.calls.transcript import Transcript
    from fak.kernel.facade import Kernel
    from fak.policy.schema import ToolCallRule, ToolCalls


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = _kernel_command(sub, "chat", _chat, "a chat session through the Kernel (persisted; resume with --session)")
    c.add_argument("--tenant", default="local")
    c.add_argument("--session", help="continue this session id")
    c.add_argument("--system", help="system message for a new session")
    c.add_argument("--max-tokens", type=int, default=256)

    s = _kernel_command(sub, "sessions", _sessions, "session ids by tenant: every tenant's in the data directory")
    s.add_argument("--tenant", help="this tenant's session ids only, one a line (default: every tenant's, grouped)")
    s.add_argument("--json", action="store_true")

    f = _kernel_command(sub, "forget", _forget, "erase a ref from every session, cache and store; prints the receipt")
    f.add_argument("ref", help="the ref's digest (blake3k:…)")
    f.add_argument("--tenant", required=True, help="the tenant that holds it")
    f.add_argument("--reason", help="why (recorded in the log and the receipt)")
    f.add_argument("--by", metavar="WHO", help=_BY)
    f.add_argument("--out", metavar="FILE", help="write the receipt JSON here (default: stdout)")

    q = _kernel_command(sub, "quarantine", _quarantine, "late detection: evict a ref from every session of the tenant")
    q.add_argument("ref", help="the ref's digest (blake3k:…)")
    q.add_argument("--tenant", required=True, help="the tenant that holds it")
    q.add_argument("--reason", required=True, help="why (recorded in the log)")

    e = _kernel_command(sub, "erase-tenant", _erase_tenant,
                        "crypto-erase a whole tenant: sessions, KV, keys, refs, API keys")
    e.add_argument("tenant")
    e.add_argument("--confirm", required=True, metavar="TENANT", help="the tenant's name again: this cannot be undone")
    e.add_argument("--reason", help="why (recorded in the log)")
    e.add_argument("--by", metavar="WHO", help=_BY)

    d = sub.add_parser("demo", help="the main job on embedded defaults")
    d.add_argument("--model", default=None, metavar="PATH", help="GGUF file or HF folder (default: SmolLM2-135M)")
    d.set_defaults(handler=_demo)
    _register_explain_tools(sub)


def _register_explain_tools(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        from fak.policy.cli import policy_commands
    except ModuleNotFoundError:  # a client-only install: no policy commands to add to (fak.cli names the extra)
        return
    commands = policy_commands(sub)
    if commands is None:
        return
    x = commands.add_parser("explain-tools", help="how an agent's tools are classified and which rules apply to them")
    x.add_argument("tools", metavar="TOOLS.json",
                   help='a JSON list of tools (OpenAI, function or MCP shape), or {"tools": [...]} (MCP tools/list)')
    x.add_argument("--policy", metavar="FILE", help=POLICY_HELP)
    add_config(x)
    x.add_argument("--json", action="store_true", help="one JSON document instead of text")
    x.set_defaults(handler=_explain_tools)
    _register_authorize(commands)


_BY = "who asked (recorded in the log)"


def _kernel_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                    handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
    """A command on the Kernel (or its database) of the settings ``--config`` names."""
    p = sub.add_parser(name, help=help)
    add_config(p)
    p.set_defaults(handler=handler)
    return p


def _open(config: str | None) -> Kernel:
    # every ``fak`` command builds this module's parsers: the Kernel (torch, the model) and the
    # database layers load only when a command that uses them runs
    from fak import Kernel
    from fak.settings import Settings

    return Kernel.open(Settings.load(config))


def _chat(args: argparse.Namespace) -> int:
    with _open(args.config) as k:
        s = k.session(args.tenant, args.session) if args.session else k.session(args.tenant)
        if args.system and not args.session:
            s.append("system", args.system)
        print(f"session {s.id} (tenant {args.tenant}); an empty line or Ctrl-D ends", file=sys.stderr)
        while True:
            try:
                line = input("you> ")
            except EOFError:
                break
            if not line.strip():
                break
            s.append("user", line)
            print("assistant> ", end="", flush=True)
            for piece in k.tokenizer.stream_text(s.generate(max_tokens=args.max_tokens)):
                print(piece, end="", flush=True)
            print()
    return 0


def _sessions(args: argparse.Namespace) -> int:
    """Read from the state database alone (no Kernel, no model): safe while ``fak serve``
    runs on the same data directory, which a second Kernel is not (``fak.owner``)."""
    # imported when the command runs, not when ``fak`` builds its parsers (see ``_open``)
    from fak.db import make_engine, release
    from fak.keys import derive_key, load_master_secret
    from fak.settings import Settings
    from fak.state.apikeys import MAC_LABEL
    from fak.state.store import StateStore
    from fak.types import check_tenant

    settings = Settings.load(args.config)
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url)
    try:
        mac = derive_key(load_master_secret(settings.data_dir, settings.master_secret_hex()), MAC_LABEL)
        store = StateStore(engine, api_key_mac=mac)
        if args.tenant is None:
            grouped = store.session_ids_by_tenant()
        else:
            grouped = {args.tenant: store.session_ids(check_tenant(args.tenant))}
    finally:
        release(engine)
    if args.tenant is not None:  # one tenant's ids, one a line, as before: for scripts
        ids = grouped[args.tenant]
        print(json.dumps(ids) if args.json else "\n".join(ids))
    elif args.json:
        print(json.dumps(grouped))
    elif not grouped:
        print("no sessions", file=sys.stderr)
    else:
        print("\n".join(f"{tenant}\n" + "\n".join(f"  {i}" for i in ids) for tenant, ids in grouped.items()))
    return 0


def _forget(args: argparse.Namespace) -> int:
    from fak.audit.receipt import verify_receipt  # when the command runs (see ``_open``)

    with _open(args.config) as k:
        # a one-shot command: the receipt completed by the survivors' independent replay
        receipt = k.forget(args.tenant, args.ref, requested_by=args.by, reason=args.reason, wait_replay=True)
        check = verify_receipt(receipt, k.audit.public_key())
        body = receipt.model_dump_json(indent=2)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(body + "\n")
        else:
            print(body)
        print(f"forgot {args.ref}: {len(receipt.units_dropped)} units dropped in {len(receipt.sessions)} "
              f"sessions; receipt verifies: {check.ok}; check it offline with: fak audit verify-receipt "
              f"RECEIPT --pubkey '{k.audit.public_key()}'", file=sys.stderr)
        return 0 if check.ok else 1


def _erase_tenant(args: argparse.Namespace) -> int:
    with _open(args.config) as k:
        event = k.erase_tenant(args.tenant, confirm=args.confirm, requested_by=args.by or "cli", reason=args.reason)
    print(json.dumps(event.model_dump(mode="json")))
    return 0 if event.shred_status == "destroyed" else 3


def _quarantine(args: argparse.Namespace) -> int:
    with _open(args.config) as k:
        report = k.quarantine(args.tenant, args.ref, reason=args.reason, principal="cli")
    print(json.dumps({"ref": report.ref, "units": report.unit_dicts(), "mode": report.mode,
                      "audit_index": report.audit_index}))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from fak.kernel.demo import run_demo  # the whole stack (API, SDK, witness): only for ``fak demo``

    return run_demo(args.model)


def _tool_list(path: str) -> list[Any]:
    """The tools of a JSON file: a list, ``{"tools": [...]}`` or a JSON-RPC ``{"result": {"tools": [...]}}``."""
    from fak.errors import FakError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FakError(f"{path}: {exc.strerror or exc}") from None
    except ValueError:
        raise FakError(f"{path}: not UTF-8") from None
    body = _json_value(text, path)
    if isinstance(body, dict) and isinstance(body.get("result"), dict):
        body = body["result"]
    if isinstance(body, dict):
        body = body.get("tools")
    if not isinstance(body, list):
        raise FakError(f'{path}: want a JSON list of tools, or an object with a "tools" list')
    return body


def _json_value(text: str, what: str) -> Any:
    """``text`` parsed as JSON, or an ``InvalidInput`` naming ``what`` (nesting too deep included:
    the parser's RecursionError is no crash)."""
    from fak.errors import InvalidInput

    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{what}: not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{what}: not JSON: nested too deeply") from None


def _explain_tools(args: argparse.Namespace) -> int:
    """Each tool's class and the rules that decide its calls, as the authorizer of the policy
    (default: the packaged one) would pick them."""
    from fak.errors import FakError, InvalidInput
    from fak.kernel.calls.authorize import Authorizer
    from fak.kernel.calls.tool_classes import spec_of
    from fak.policy.cli import deployment_policy

    auth = Authorizer(deployment_policy(args.policy))
    calls = auth.policy.spec.tool_calls
    report: list[dict[str, Any]] = []
    for i, tool in enumerate(_tool_list(args.tools)):
        try:
            spec = spec_of(tool)
        except InvalidInput as exc:
            print(f"{args.tools}: tools[{i}]: skipped: {exc}", file=sys.stderr)
            continue
        cls, inferred = auth.tool_class(spec.name, spec, None)
        own = auth.rules_for(spec.name)
        source = "policy" if own else "inferred" if calls.from_schemas else "none"
        rules = own if own else inferred if source == "inferred" else []
        report.append({**cls.as_dict(), "rules_from": source, "unlisted": calls.unlisted,
                       "rules": [r.model_dump(mode="json", exclude_defaults=True) for r in rules]})
        if not args.json:
            print(("\n" if len(report) > 1 else "") + _explained(cls, source, rules, calls))
    if args.json:
        print(json.dumps({"tools": report}, indent=2, ensure_ascii=False))
    if not report:
        raise FakError(f"{args.tools}: no function tool")
    return 0


def _explained(cls: ToolClass, source: str, rules: list[ToolCallRule], calls: ToolCalls) -> str:
    """One tool as text: its class, why, and its rules with their conditions in a line each."""
    lines = [f"{cls.tool}: {cls.effect} (from the {cls.basis})"]
    lines.append("  routing: " + (", ".join(f"{p}={k}" for p, k in cls.routing) or "none"))
    lines.append("  content: " + (", ".join(cls.content) or "none"))
    lines += [f"  - {reason}" for reason in cls.reasons]
    if source == "none":
        lines.append(f"  rules: none names it and from_schemas is off: unlisted decides ({calls.unlisted})")
        return "\n".join(lines)
    lines.append(f"  rules ({'the policy' if source == 'policy' else 'inferred'}):")
    for rule in rules:
        conditions = _conditions(rule)
        audit = " (audit)" if rule.action == "audit" else ""
        lines.append(f"    {rule.id} {rule.verdict}{audit}" + (f" when {' and '.join(conditions)}" if conditions else ""))
    lines.append(f"  none fires: {calls.unlisted}")
    return "\n".join(lines)


def _conditions(rule: ToolCallRule) -> list[str]:
    """A tool-call rule's conditions, one phrase each."""
    conditions = []
    if rule.when_in_attention is not None:
        conditions.append(f"untrusted in attention ({'/'.join(rule.when_in_attention.trust)})")
    for m in rule.when_args_from or ():
        extra = " entities only" if m.entities_only else ""
        extra += f" (except {len(m.except_fields)} field globs)" if m.except_fields else ""
        conditions.append(f"{','.join(m.args)} from {'/'.join(m.trust)}{extra}")
    if rule.when_args_absent:
        conditions.append(f"no {','.join(rule.when_args_absent)}")
    if rule.when_endorsed is not None:
        conditions.append(f"{','.join(rule.when_endorsed.args)} endorsed by {'/'.join(rule.when_endorsed.by)}")
    if rule.when_attention is not None:
        conditions.append(f"attention on {'/'.join(rule.when_attention.trust)} > {rule.when_attention.above}")
    return conditions


BAD_INPUT = 3  # `fak policy authorize`: the exit status of an input it cannot judge (0 ALLOW, 1 CONFIRM, 2 DENY)
_EXIT = {"ALLOW": 0, "CONFIRM": 1, "DENY": 2}


def _register_authorize(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = commands.add_parser(
        "authorize", help="judge a tool call offline against a policy and a context file (exit 0 ALLOW, "
                          "1 CONFIRM, 2 DENY, 3 bad input)")
    a.add_argument("--context", required=True, metavar="FILE.jsonl",
                   help='the messages and tool results, one JSON object a line: {"role": "system"|"user"|'
                        '"assistant", "content": ...} or {"role": "tool", "tool": NAME, "content": ..., '
                        '"source": URL, "media_type": TYPE}')
    a.add_argument("--tool", required=True, metavar="NAME", help="the tool the agent calls")
    a.add_argument("--args", default="{}", metavar="JSON", help="the call's arguments, a JSON object (default {})")
    a.add_argument("--policy", metavar="FILE", help=POLICY_HELP)
    add_config(a)
    a.add_argument("--schema", metavar="TOOLS.json",
                   help="the agent's tools (as for explain-tools): the called tool's schema classifies it "
                        "when no rule names it (from_schemas)")
    a.add_argument("--tool-def", metavar="JSON", help="the called tool's definition (OpenAI, function or MCP "
                                                      "shape), instead of --schema")
    a.add_argument("--json", action="store_true", help="one JSON document instead of text")
    a.set_defaults(handler=_authorize)

    def usage_error(message: str) -> NoReturn:  # exit 2 is DENY here: a usage error is bad input
        a.print_usage(sys.stderr)
        a.exit(BAD_INPUT, f"{a.prog}: error: {message}\n")

    a.error = usage_error  # type: ignore[method-assign]


def _authorize(args: argparse.Namespace) -> int:
    """The decision of the policy (default: the packaged one) on calling ``--tool`` with
    ``--args`` in the context of ``--context``, with no model and no data directory. Exit 0
    ALLOW, 1 CONFIRM, 2 DENY, 3 for input it cannot judge (named by file and line)."""
    from fak.errors import FakError

    try:
        return _authorize_call(args)
    except FakError as exc:
        print(f"fak: error: {exc}", file=sys.stderr)
        return BAD_INPUT


def _authorize_call(args: argparse.Namespace) -> int:
    from fak.errors import InvalidInput
    from fak.kernel.calls.authorize import Authorizer, args_bytes
    from fak.kernel.calls.tool_classes import spec_of
    from fak.kernel.calls.transcript import read_transcript
    from fak.policy.cli import deployment_policy

    call_args = _json_value(args.args, "--args")
    if not isinstance(call_args, dict):
        raise InvalidInput("--args: want a JSON object of the call's arguments")
    args_bytes(call_args)  # as the kernel checks a call's arguments (size, JSON values)
    spec: ToolSpec | None = None
    if args.tool_def is not None:
        if args.schema is not None:
            raise InvalidInput("give --schema or --tool-def, not both")
        definition = _json_value(args.tool_def, "--tool-def")
        try:
            spec = spec_of(definition)
        except InvalidInput as exc:
            raise InvalidInput(f"--tool-def: {exc}") from None
        if args.tool not in (spec.name, spec.decided_as):
            raise InvalidInput(f"--tool-def defines {spec.name!r:.80}, the call is of {args.tool!r:.80}")
    elif args.schema is not None:
        specs = []
        for i, tool in enumerate(_tool_list(args.schema)):
            try:
                specs.append(spec_of(tool))
            except InvalidInput as exc:
                print(f"{args.schema}: tools[{i}]: skipped: {exc}", file=sys.stderr)
        spec = next((s for s in specs if args.tool in (s.name, s.decided_as)), None)
        if spec is None:  # as a session whose declared tools do not name it: classified from the call
            print(f"{args.schema}: no tool {args.tool!r:.80}: classified from the call's argument names",
                  file=sys.stderr)
    auth = Authorizer(deployment_policy(args.policy))
    transcript = read_transcript(args.context, auth.policy)
    decision = auth.decide(args.tool, transcript.context, call_args, spec=spec)
    report = _authorize_report(auth, transcript, decision, call_args)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(_authorize_text(report))
    return _EXIT[decision.verdict]


def _authorize_report(auth: Authorizer, transcript: Transcript, decision: ToolCallDecision,
                      call_args: dict[str, Any]) -> dict[str, Any]:
    """The decision as JSON values: the verdict, the rule and why, the offending refs with
    their lines, every argument's provenance, and what the gate made of each tool line."""
    from fak.kernel.calls.provenance import leaves
    from fak.kernel.calls.tool_classes import inferred_rules

    rule = None
    if decision.rule_id not in (None, "unlisted"):
        # the rules that decided: the policy's for the tool, else those inferred from its class
        rules = auth.rules_for(decision.tool) or (
            inferred_rules(decision.tool_class) if decision.tool_class is not None else [])
        found = next((r for r in rules if r.id == decision.rule_id), None)
        if found is not None:
            rule = {"id": found.id, "verdict": found.verdict, "description": found.description,
                    "conditions": _conditions(found)}
    values = {path: value for path, value in leaves(call_args)}
    triggers = {(t.path, t.entity) for t in decision.triggers}
    policy = auth.policy
    return {
        "verdict": decision.verdict,
        "rule_id": decision.rule_id,
        "enforced": decision.enforced,
        "would_be": decision.would_be,
        "tool": decision.tool,
        "policy": {"name": policy.name, "digest": policy.digest},
        "context": transcript.path,
        "rule": rule,
        "unlisted": policy.spec.tool_calls.unlisted,
        "named_by_rules": bool(auth.rules_for(decision.tool)),
        "tool_class": decision.tool_class.as_dict() if decision.tool_class is not None else None,
        "audited": list(decision.audited),
        "offending": [{"ref": ref, "lines": transcript.lines_of_ref(ref)} for ref in decision.offending],
        "triggers": [_trace_json(transcript, t, values, True) for t in decision.triggers],
        "arguments": [_trace_json(transcript, t, values, (t.path, t.entity) in triggers)
                      for t in decision.arguments],
        "lines": [{"line": x.number, "role": x.role, "tool": x.tool, "source": x.source,
                   "media_type": x.media_type, "verdict": x.verdict.kind.value if x.verdict else None,
                   "would_be": x.verdict.would_be.value if x.verdict and x.verdict.would_be else None,
                   "rule_id": x.verdict.rule_id if x.verdict else None,
                   "trust": x.verdict.trust if x.verdict else None,
                   "admitted": x.role in ("system", "user") or x.admitted_ref is not None,
                   "ref": x.admitted_ref or x.ref} for x in transcript.lines],
    }


def _trace_json(transcript: Transcript, t: ArgumentTrace, values: dict[str, Any], trigger: bool) -> dict[str, Any]:
    """One argument's provenance, its sources named by context line."""
    return {"path": t.path, "entity": t.entity, "kind": t.kind, "origin": t.origin, "trigger": trigger,
            "value": values.get(t.path) if t.entity is None else None,
            "sources": [_source_json(transcript, s) for s in t.sources]}


def _source_json(transcript: Transcript, s: ValueSource) -> dict[str, Any]:
    number = transcript.line_of_segment(s.segment)
    line = next((x for x in transcript.lines if x.number == number), None)
    return {"line": number, "role": line.role if line else None, "tool": line.tool if line else None,
            "source": line.source if line else None, "ref": s.ref, "trust": s.trust, "field": s.field,
            "inside": s.inside, "start": s.start, "end": s.end,
            "text": line.text[s.start:s.end] if line else None}


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = json.dumps(text[:width] + ("…" if len(text) > width else ""), ensure_ascii=False)
    return text


def _where(source: dict[str, Any]) -> str:
    """``line 3 (web_fetch https://…) field emails.0.from, untrusted``."""
    who = source["role"] if source["role"] != "tool" else " ".join(
        x for x in (source["tool"], source["source"]) if x)
    field = f" field {source['field']}{' (inside)' if source['inside'] else ''}" if source["field"] else ""
    return f"line {source['line']} ({who}){field}, {source['trust']}"


def _authorize_text(report: dict[str, Any]) -> str:
    """The report as text, for a person."""
    verdict = report["verdict"]
    if not report["enforced"]:
        verdict += f" (audit mode: would be {report['would_be']})"
    rule = report["rule"]
    out = [f"{report['tool']}: {verdict}", f"  policy: {report['policy']['name']} {report['policy']['digest']}"]
    if rule is not None:
        out.append(f"  rule: {rule['id']} ({rule['verdict']})" + (f": {rule['description']}" if rule["description"]
                                                                   else ""))
        if rule["conditions"]:
            out.append(f"    fires when {' and '.join(rule['conditions'])}")
    elif report["rule_id"] == "unlisted":
        out.append(f"  rule: unlisted: no rule fired{'' if report['named_by_rules'] else ' (none names the tool)'}"
                   f"; tool_calls.unlisted is {report['unlisted']}")
    else:
        out.append("  rule: none fired" + ("" if report["named_by_rules"] or report["tool_class"]
                                            else f" (none names the tool; unlisted is {report['unlisted']})"))
    if report["tool_class"] is not None:
        cls = report["tool_class"]
        routing = ", ".join(f"{p}={k}" for p, k in cls["routing"].items()) or "none"
        out.append(f"  class: {cls['effect']} (from the {cls['basis']}), routing: {routing}")
    if report["audited"]:
        out.append(f"  audited (changed nothing): {', '.join(report['audited'])}")
    for off in report["offending"]:
        lines = ", ".join(map(str, off["lines"])) or "?"
        out.append(f"  offending: {off['ref']} (line {lines})")
    if report["triggers"]:
        out.append("  because:")
        for t in report["triggers"]:
            out.append(f"    {_argument(t)}")
            out += [f"      from {_where(s)}: {_short(s['text'])}" for s in t["sources"]]
    out.append("  arguments:")
    for t in report["arguments"] or []:
        mark = " *" if t["trigger"] else ""
        out.append(f"    {_argument(t)}{mark}")
        out += [f"      in {_where(s)}" for s in t["sources"]]
    if not report["arguments"]:
        out.append("    (none traced)")
    out.append("  context:")
    for x in report["lines"]:
        if x["role"] != "tool":
            note = "" if x["role"] != "assistant" else " (not searched: the model's own words)"
            out.append(f"    line {x['line']}: {x['role']}{note}")
            continue
        src = f" {x['source']}" if x["source"] else ""
        would = f", would be {x['would_be']}" if x["would_be"] else ""
        kept = f"admitted as {x['ref']}" if x["admitted"] else "left out of the context"
        out.append(f"    line {x['line']}: tool {x['tool']}{src}: {x['verdict']} ({x['rule_id']}{would}), "
                   f"trust {x['trust']}: {kept}")
    return "\n".join(out)


def _argument(t: dict[str, Any]) -> str:
    """``to = "a@b.example": untrusted`` or ``body: an email inside it: untrusted``."""
    if t["entity"] is not None:
        return f"{t['path']}: {'an' if t['entity'][0] in 'aeiou' else 'a'} {t['entity']} inside it: {t['origin']}"
    return f"{t['path']} = {_short(t['value'])}: {t['origin']}"
