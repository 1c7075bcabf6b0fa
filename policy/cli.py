"""``fak policy check FILE…`` (also ``fak policy validate``) and ``fak gate --policy FILE``.

``fak policy explain-tools`` reads tool schemas with the kernel's tool classes, which this layer
must not import: ``fak.kernel.cli`` adds it to the subcommands ``policy_commands`` returns."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Literal, TextIO

from fak.cli_options import POLICY_HELP, add_config
from fak.errors import FakError
from fak.policy.egress import JudgeEgress
from fak.policy.errors import PolicyError
from fak.policy.gate import gate
from fak.policy.policy import Policy, load_policy
from fak.policy.verdict import GateContext, Verdict

if TYPE_CHECKING:
    from fak.settings import Settings

NOT_ALLOWED = 3  # `fak gate --exit-code`: some verdict was not ALLOW
_COMMANDS = "policy_commands"  # the ``fak policy`` parser's default that holds its subcommands


def policy_commands(
        subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    """The ``fak policy`` subcommands, for a layer above this one that adds a command (None
    before ``register`` ran, or where this layer's commands are not installed)."""
    policy = subparsers.choices.get("policy")
    commands: argparse._SubParsersAction[argparse.ArgumentParser] | None = (
        policy.get_default(_COMMANDS) if policy is not None else None)
    return commands


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = subparsers.add_parser("policy", help="policy files")
    psub = policy.add_subparsers(dest="policy_command", metavar="COMMAND")
    check = psub.add_parser("check", aliases=["validate"],
                            help="validate policy files (exit 1 with file:line:col errors)")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy file or directory")
    add_config(check)
    check.set_defaults(handler=_check)

    def policy_help(_args: argparse.Namespace) -> int:
        policy.print_help()
        return 2

    policy.set_defaults(handler=policy_help, **{_COMMANDS: psub})

    command = subparsers.add_parser("gate", help="run the admission gate on a tool result (stdin) or a JSONL corpus")
    command.add_argument("--policy", metavar="FILE", help=POLICY_HELP)
    command.add_argument("--tool", default="tool", help="tool name for stdin input (default: tool)")
    command.add_argument("--media-type", default=None, help="media type of the stdin input")
    command.add_argument("--source", default=None, metavar="URL", help="the URL the stdin input came from")
    command.add_argument("--jsonl", metavar="IN",
                         help='read lines {"tool": ..., "text": ..., "source": URL (optional)}; "-" for stdin')
    command.add_argument("--out", metavar="OUT", default="-", help="where verdict lines go (default stdout)")
    command.add_argument("--exit-code", action="store_true",
                         help=f"exit {NOT_ALLOWED} when a verdict is not ALLOW (errors exit 1, usage 2)")
    add_config(command)
    command.set_defaults(handler=_gate)


def _settings() -> Settings:
    from fak.settings import Settings  # ~0.3 s that ``fak`` pays only when a policy command runs

    # weights named: nothing here needs them, and their default probes the CPU (imports torch)
    return Settings.load(weights="float32")


def deployment_egress() -> JudgeEgress:
    """The deployment's judge allow-lists from its settings (``--config``, ``FAK_*``), so a
    policy checks here as the server would load it."""
    return _settings().judge_allow_lists()


def deployment_policy(given: str | None) -> Policy:
    """The policy a command judges with, picked as ``fak serve`` picks it (``--policy``, else the
    settings' ``policy_path``, else the packaged policy) and loaded against the deployment's judge
    allow-lists: the settings read once."""
    settings = _settings()
    path = given or settings.policy_path
    if path is None:
        import importlib.resources

        path = str(importlib.resources.files("fak.policy").joinpath("default.yaml"))
    return load_policy(path, settings.judge_allow_lists())


def _check(args: argparse.Namespace) -> int:
    egress = deployment_egress()
    failed = 0
    for name in args.files:
        try:
            policy = load_policy(name, egress)
        except PolicyError as exc:
            failed += 1
            print(str(exc), file=sys.stderr)
            continue
        print(f"{name}: ok {policy.name} {policy.digest}")
    return 1 if failed else 0


def _verdict_json(verdict: Verdict, extra: dict[str, object] | None = None) -> str:
    body = json.loads(verdict.model_dump_json(exclude={"redacted_bytes"}))
    if verdict.redacted_bytes is not None:
        body["redacted_text"] = verdict.redacted_bytes.decode("utf-8", "replace")
    if extra:
        body = {**extra, "verdict": body}
    return json.dumps(body, ensure_ascii=False)


def _gate(args: argparse.Namespace) -> int:
    policy = deployment_policy(args.policy)
    if args.jsonl is None:
        data = sys.stdin.buffer.read()
        context = GateContext(media_type=args.media_type, source=args.source) \
            if args.media_type or args.source else None
        verdict = gate(policy, args.tool, data, context)
        print(_verdict_json(verdict))
        return NOT_ALLOWED if args.exit_code and verdict.kind.value != "ALLOW" else 0
    return _gate_jsonl(policy, args)


def _gate_jsonl(policy: Policy, args: argparse.Namespace) -> int:
    from tqdm import tqdm  # a progress bar for corpora only

    source = sys.stdin if args.jsonl == "-" else _open(args.jsonl, "r")
    sink = sys.stdout if args.out == "-" else _open(args.out, "w")
    counts: dict[str, int] = {}
    bad = 0
    try:
        for number, line in enumerate(tqdm(source, desc="gate", unit="line", file=sys.stderr, disable=None), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError('want an object with a string "text"')
                tool = str(record.get("tool", args.tool))
                source = record.get("source")
                if source is not None and not isinstance(source, str):
                    raise ValueError('"source" must be a string (a URL)')
            except ValueError as exc:
                bad += 1
                print(f"{args.jsonl}:{number}: skipped: {exc}", file=sys.stderr)
                continue
            context = GateContext(source=source) if source is not None else None
            verdict = gate(policy, tool, record["text"].encode("utf-8", "surrogatepass"), context)
            counts[verdict.kind.value] = counts.get(verdict.kind.value, 0) + 1
            extra = {k: v for k, v in record.items() if k != "text"}
            sink.write(_verdict_json(verdict, extra) + "\n")
    finally:
        if sink is not sys.stdout:
            sink.close()
    summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    print(f"gate: {summary or 'no input'}{f' skipped={bad}' if bad else ''}", file=sys.stderr)
    if bad and not counts:
        raise FakError(f"{args.jsonl}: no valid line")
    return NOT_ALLOWED if args.exit_code and set(counts) - {"ALLOW"} else 0


def _open(path: str, mode: Literal["r", "w"]) -> TextIO:
    try:
        return open(path, mode, encoding="utf-8")  # noqa: SIM115 - closed by the caller
    except OSError as exc:
        raise FakError(f"{path}: {exc.strerror or exc}") from None
