"""``fak audit ...``: export, verify, verify-receipt, checkpoint, proof, pubkey."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from fak.cli_options import add_config, add_database_url

if TYPE_CHECKING:
    from fak.audit.log import AuditLog
    from fak.audit.verify import WitnessPolicy


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("audit", help="signed Merkle audit log: export, verify, proofs")
    sub = p.add_subparsers(dest="audit_command", metavar="ACTION")

    v = sub.add_parser("verify", help="verify a log export offline (fails closed)")
    v.add_argument("export", nargs="?", help="file written by 'fak audit export', or a tenant's export from the API "
                   "(not with --tiles)")
    v.add_argument("--tiles", metavar="URL", help="verify a log served as C2SP tiles from this prefix (e.g. "
                   "https://fak.example/v1/audit/log) instead of an export: checkpoint signature, witness quorum, "
                   "the tiles against its root, consistency with --since-checkpoint, inclusion of each --entry")
    v.add_argument("--key", metavar="API_KEY", help="with --tiles: an auditor or admin API key (none for a public log)")
    v.add_argument("--since-checkpoint", metavar="FILE", help="with --tiles: the last checkpoint this auditor saw; "
                   "the served one must be consistent with it, and replaces it in FILE once verified")
    v.add_argument("--entry", type=int, action="append", default=[], metavar="N",
                   help="with --tiles: an entry index to prove included (read from its bundle); repeatable")
    _trust_args(v, "names the log or --trust-embedded-key")
    v.add_argument("--trust-embedded-key", action="store_true",
                   help="DEVELOPMENT ONLY: check against the key the export names itself (proves nothing)")
    v.add_argument("--allow-unsigned-tail", action="store_true",
                   help="accept entries after the last signed (and witnessed) checkpoint as unverified")
    v.add_argument("--since", help="a signed checkpoint (file) or an earlier export the export must extend; "
                   "an earlier export also names the exact entry a rewrite changed")
    v.add_argument("--max-age", type=float, metavar="SECONDS",
                   help="fail when the trusted checkpoint is older than this (or carries no time)")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=_verify)

    r = sub.add_parser("verify-receipt", help="verify a forget receipt offline")
    r.add_argument("receipt", help="forget receipt JSON file ('-' reads stdin)")
    _trust_args(r, "names the log")
    r.add_argument("--last-checkpoint", metavar="FILE",
                   help="the newest signed checkpoint you trust: the receipt's must be consistent with it")
    r.add_argument("--consistency-proof", metavar="FILE",
                   help="JSON consistency proof (oldSize, treeSize, hashes) between --last-checkpoint and the "
                   "receipt's checkpoint, when the receipt does not carry one")
    r.add_argument("--require-replay", action="store_true",
                   help="fail unless the receipt carries the logged independent replay of the survivors "
                   "(a receipt fetched right after the forget has it pending)")
    r.set_defaults(handler=_verify_receipt)

    e = sub.add_parser("export", help="write all entries and checkpoints to a file")
    e.add_argument("path")
    e.set_defaults(handler=_export)

    c = sub.add_parser("checkpoint", help="sign and print a checkpoint of the current tree")
    c.set_defaults(handler=_checkpoint)

    k = sub.add_parser("pubkey", help="print the log's verifier key")
    k.set_defaults(handler=_pubkey)

    pr = sub.add_parser("proof", help="print an inclusion proof for an entry")
    pr.add_argument("index", type=int)
    pr.add_argument("--format", choices=("json", "tlog"), default="json")
    pr.set_defaults(handler=_proof)
    for on_the_database in (e, c, k, pr):
        add_config(on_the_database)
        add_database_url(on_the_database)

    p.set_defaults(handler=prints_help(p))


def prints_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The handler of a command group run without an action: its help, exit status 2."""

    def handler(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return handler


def _trust_args(p: argparse.ArgumentParser, pubkey_unless: str) -> None:
    """What an offline verification trusts (read by ``_policy``): the pinned log key and the
    witness policy."""
    p.add_argument("--pubkey", help="pinned verifier key of the log (string or file); required unless a "
                   "--witness-policy " + pubkey_unless)
    p.add_argument("--witness", action="append", default=[], metavar="VKEY",
                   help="a witness's cosignature/v1 verifier key (string or file); repeatable")
    p.add_argument("--quorum", type=int, help="valid cosignatures needed (default: every --witness)")
    p.add_argument("--witness-policy", metavar="FILE", help="witness policy file: 'log <vkey>', 'witness <name> "
                   "<vkey>', 'quorum <N|all|any|none>' lines (see docs/audit.md)")
    p.add_argument("--policy", dest="witness_policy", help=argparse.SUPPRESS)  # the former spelling


def _policy(args: argparse.Namespace) -> tuple[WitnessPolicy | None, str | None]:
    """The witness policy from --witness-policy or --witness/--quorum (None when neither), and the
    pinned log key (--pubkey, else the policy's log line)."""
    from fak.audit.errors import AuditError
    from fak.audit.verify import WitnessPolicy

    if args.witness_policy and (args.witness or args.quorum is not None):
        raise AuditError("give either --witness-policy or --witness/--quorum, not both")
    policy = None
    if args.witness_policy:
        policy = WitnessPolicy.load(args.witness_policy)
    elif args.witness or args.quorum is not None:
        policy = WitnessPolicy.from_keys(args.witness, args.quorum)
    pubkey = args.pubkey
    if policy is not None and policy.log_key is not None:
        if pubkey is None:
            pubkey = policy.log_key
        elif _key(pubkey) != policy.log_key:
            raise AuditError("--pubkey differs from the log key the --witness-policy names")
    return policy, pubkey


def _key(value: str) -> str:
    from fak.audit.note import Verifier
    from fak.audit.verify import _load_text

    return Verifier.parse(_load_text(value, "public key").strip()).vkey()


def _open(args: argparse.Namespace) -> AuditLog:
    from fak.audit.log import AuditLog

    return AuditLog.open(url=getattr(args, "url", None))


def _verify(args: argparse.Namespace) -> int:
    from fak.audit.errors import AuditError
    from fak.audit.tenant_export import is_tenant_export, verify_tenant_export
    from fak.audit.verify import verify_export

    policy, pubkey = _policy(args)
    if args.tiles:
        return _verify_tiles(args, policy, pubkey)
    if args.export is None:
        raise AuditError("give an export file to verify, or --tiles URL")
    if args.trust_embedded_key:
        print("WARNING: --trust-embedded-key: checking against the key the export names itself; anyone can make "
              "such an export; this proves nothing", file=sys.stderr)
    if is_tenant_export(args.export):  # a tenant's export from the API: proofs per entry
        tenant_report = verify_tenant_export(args.export, pubkey or "", witnesses=policy, max_age=args.max_age)
        print(tenant_report.summary(), file=sys.stdout if tenant_report.ok else sys.stderr)
        return 0 if tenant_report.ok else 1
    report = verify_export(args.export, pubkey=pubkey, since=args.since, progress=not args.json,
                           trust_embedded_key=args.trust_embedded_key, allow_unsigned_tail=args.allow_unsigned_tail,
                           witnesses=policy, max_age=args.max_age)  # fmt: skip
    if args.json:
        out = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in vars(report).items()}
        print(json.dumps(out, indent=2))
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def _verify_tiles(args: argparse.Namespace, policy: WitnessPolicy | None, pubkey: str | None) -> int:
    """``fak audit verify --tiles URL``: the log from its tiles alone, as any tiles client."""
    from pathlib import Path

    import httpx

    from fak.audit.errors import AuditError
    from fak.audit.tiles import verify_tiles
    from fak.audit.verify import _load_text

    if args.export is not None or args.trust_embedded_key or args.since or args.allow_unsigned_tail:
        raise AuditError("--tiles verifies a served log: give no export file, --since, --allow-unsigned-tail "
                         "or --trust-embedded-key with it")
    if pubkey is None:
        raise AuditError("a pinned log key is required (--pubkey, or a --witness-policy with a 'log' line): "
                         "there is no trust on first use")
    since_file = Path(args.since_checkpoint) if args.since_checkpoint else None
    try:
        since = since_file.read_text() if since_file is not None and since_file.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditError(f"cannot read the last seen checkpoint {since_file}: {exc}") from None
    prefix = args.tiles.rstrip("/")
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    with httpx.Client(headers=headers, timeout=30.0) as client:

        def fetch(path: str) -> bytes:
            url = f"{prefix}/{path}"
            try:
                r = client.get(url)
            except httpx.HTTPError as exc:
                raise AuditError(f"GET {url}: {exc}") from None
            if r.status_code != 200:
                detail = r.json().get("detail", "") if "json" in r.headers.get("content-type", "") else ""
                raise AuditError(f"GET {url}: HTTP {r.status_code} {detail}".rstrip())
            return r.content

        report = verify_tiles(fetch, _load_text(pubkey, "public key"), witnesses=policy, since=since,
                              entries=args.entry, max_age=args.max_age, progress=not args.json)
    if args.json:
        print(json.dumps({"ok": report.ok, "size": report.size, "root": report.root.hex(),
                          "detail": report.detail, "failure": report.failure}, indent=2))
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    if report.ok and since_file is not None and report.checkpoint is not None:
        try:
            since_file.write_text(report.checkpoint.note)
        except OSError as exc:
            raise AuditError(f"cannot store the verified checkpoint in {since_file}: {exc.strerror}") from None
    return 0 if report.ok else 1


def _verify_receipt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fak.audit.errors import AuditError
    from fak.audit.receipt import verify_receipt
    from fak.audit.verify import _load_text

    try:
        text = sys.stdin.read() if args.receipt == "-" else Path(args.receipt).read_text()
    except OSError as exc:
        raise AuditError(f"cannot read receipt {args.receipt}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AuditError(f"receipt {args.receipt} is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AuditError(f"receipt {args.receipt} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AuditError(f"receipt {args.receipt} is not a JSON object")
    policy, pubkey = _policy(args)
    if pubkey is None:
        raise AuditError("a pinned log key is required (--pubkey, or a --witness-policy with a 'log' line): "
                         "there is no trust on first use")
    last = _load_text(args.last_checkpoint, "checkpoint") if args.last_checkpoint else None
    proof = None
    if args.consistency_proof:
        try:
            proof = json.loads(Path(args.consistency_proof).read_text())
        except (OSError, ValueError) as exc:
            raise AuditError(f"cannot read consistency proof {args.consistency_proof}: {exc}") from None
    check = verify_receipt(data, _load_text(pubkey, "public key"), witnesses=policy, last_checkpoint=last,
                           consistency_proof=proof, require_replay=args.require_replay)  # fmt: skip
    if check.ok:
        print(f"receipt OK: forget {data.get('request_id')} of {data.get('ref')} (tenant {data.get('tenant') or '-'}) "
              f"is logged at {data.get('log_index')} under the pinned key; {check.detail}")
        return 0
    print(f"receipt FAILED: {check.reason}", file=sys.stderr)
    return 1


def _export(args: argparse.Namespace) -> int:
    with _open(args) as log:
        n = log.export(args.path)
        print(f"exported {n} entries to {args.path}; verify with: fak audit verify {args.path} "
              f"--pubkey '{log.public_key()}'")
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    with _open(args) as log:
        sys.stdout.write(log.checkpoint().note)
    return 0


def _pubkey(args: argparse.Namespace) -> int:
    with _open(args) as log:
        print(log.public_key())
    return 0


def _proof(args: argparse.Namespace) -> int:
    with _open(args) as log:
        proof = log.inclusion_proof(args.index)
        if args.format == "tlog":
            sys.stdout.write(proof.to_tlog_proof())
        else:
            print(json.dumps(proof.to_json(), indent=2))
    return 0
