"""``fak chat``, ``fak sessions``, ``fak forget``, ``fak quarantine``, ``fak erase-tenant`` and ``fak demo``: the
Kernel from a terminal (in process, on the data directory the settings name). Those that open a Kernel refuse, naming the
pid, while ``fak serve`` (or another Kernel) runs on that data directory (``fak.owner``); ``fak sessions``
only reads the database and works beside it. ``fak policy explain-tools`` (added to the policy layer's commands, which
may not import the kernel) shows how the tool classes read an agent's tool schemas."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fak.kernel.calls.tool_classes import ToolClass
    from fak.kernel.facade import Kernel
    from fak.policy.schema import ToolCallRule, ToolCalls


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = _kernel_command(sub, "chat", _chat, "a chat session through the Kernel (persisted; resume with --session)")
    c.add_argument("--tenant", default="local")
    c.add_argument("--session", help="continue this session id")
    c.add_argument("--system", help="system message for a new session")
    c.add_argument("--max-tokens", type=int, default=256)

    s = _kernel_command(sub, "sessions", _sessions, "a tenant's sessions")
    s.add_argument("--tenant", default="local")
    s.add_argument("--json", action="store_true")

    f = _kernel_command(sub, "forget", _forget, "erase a ref from every session, cache and store; prints the receipt")
    f.add_argument("ref")
    f.add_argument("--tenant", required=True)
    f.add_argument("--reason")
    f.add_argument("--by", help=_BY)
    f.add_argument("--out", help="write the receipt JSON here (default: stdout)")

    q = _kernel_command(sub, "quarantine", _quarantine, "late detection: evict a ref from every session of the tenant")
    q.add_argument("ref")
    q.add_argument("--tenant", required=True)
    q.add_argument("--reason", required=True)

    e = _kernel_command(sub, "erase-tenant", _erase_tenant,
                        "crypto-erase a whole tenant: sessions, KV, keys, refs, API keys")
    e.add_argument("tenant")
    e.add_argument("--confirm", required=True, help="the tenant's name again: this cannot be undone")
    e.add_argument("--reason")
    e.add_argument("--by", help=_BY)

    d = sub.add_parser("demo", help="the main job on embedded defaults")
    d.add_argument("--model", default=None)
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
    x.add_argument("--policy", metavar="FILE", help="policy file or directory (default: the packaged policy)")
    x.add_argument("--json", action="store_true", help="one JSON document instead of text")
    x.set_defaults(handler=_explain_tools)


_BY = "who asked (recorded in the log)"


def _kernel_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                    handler: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
    """A command on the Kernel (or its database) of the settings ``--config`` names."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--config", help="settings file; FAK_* variables override it")
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
        ids = StateStore(engine, api_key_mac=mac).session_ids(check_tenant(args.tenant))
    finally:
        release(engine)
    print(json.dumps(ids) if args.json else "\n".join(ids))
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
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FakError(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise FakError(f"{path}: not JSON: {exc}") from None
    if isinstance(body, dict) and isinstance(body.get("result"), dict):
        body = body["result"]
    if isinstance(body, dict):
        body = body.get("tools")
    if not isinstance(body, list):
        raise FakError(f'{path}: want a JSON list of tools, or an object with a "tools" list')
    return body


def _explain_tools(args: argparse.Namespace) -> int:
    """Each tool's class and the rules that decide its calls, as the authorizer of the policy
    (default: the packaged one) would pick them."""
    from fak.errors import FakError, InvalidInput
    from fak.kernel.calls.authorize import Authorizer
    from fak.kernel.calls.tool_classes import spec_of
    from fak.kernel.facade import default_policy_path
    from fak.policy.cli import deployment_egress
    from fak.policy.policy import load_policy

    auth = Authorizer(load_policy(args.policy or default_policy_path(), deployment_egress()))
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
        audit = " (audit)" if rule.action == "audit" else ""
        lines.append(f"    {rule.id} {rule.verdict}{audit}" + (f" when {' and '.join(conditions)}" if conditions else ""))
    lines.append(f"  none fires: {calls.unlisted}")
    return "\n".join(lines)
