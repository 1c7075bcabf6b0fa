"""``fak audit ...``: export, verify, verify-receipt, checkpoint, proof, pubkey."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("audit", help="signed Merkle audit log: export, verify, proofs")
    sub = p.add_subparsers(dest="audit_command", metavar="ACTION")

    v = sub.add_parser("verify", help="verify a log export offline")
    v.add_argument("export", help="file written by 'fak audit export'")
    v.add_argument("--pubkey", help="pinned verifier key (string or file); default: the key the export names")
    v.add_argument("--since", help="a signed checkpoint (file) the export must extend")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(handler=_verify)

    r = sub.add_parser("verify-receipt", help="verify a forget receipt offline")
    r.add_argument("receipt", help="forget receipt JSON file ('-' reads stdin)")
    r.add_argument("--pubkey", required=True, help="pinned verifier key of the log (string or file)")
    r.set_defaults(handler=_verify_receipt)

    e = sub.add_parser("export", help="write all entries and checkpoints to a file")
    e.add_argument("path")
    e.add_argument("--url", help="database URL (default: FAK_DATABASE_URL or the data dir's fak.db)")
    e.set_defaults(handler=_export)

    c = sub.add_parser("checkpoint", help="sign and print a checkpoint of the current tree")
    c.add_argument("--url")
    c.set_defaults(handler=_checkpoint)

    k = sub.add_parser("pubkey", help="print the log's verifier key")
    k.add_argument("--url")
    k.set_defaults(handler=_pubkey)

    pr = sub.add_parser("proof", help="print an inclusion proof for an entry")
    pr.add_argument("index", type=int)
    pr.add_argument("--format", choices=("json", "tlog"), default="json")
    pr.add_argument("--url")
    pr.set_defaults(handler=_proof)
    p.set_defaults(handler=lambda _args: (p.print_help(), 2)[1])


def _open(args: argparse.Namespace):  # noqa: ANN202
    from fak.audit.log import AuditLog

    return AuditLog.open(url=getattr(args, "url", None))


def _verify(args: argparse.Namespace) -> int:
    from fak.audit.tenant_export import is_tenant_export, verify_tenant_export
    from fak.audit.verify import verify_export

    if is_tenant_export(args.export):  # a tenant's export from the API: proofs per entry
        tenant_report = verify_tenant_export(args.export, args.pubkey or "")
        print(tenant_report.summary(), file=sys.stdout if tenant_report.ok else sys.stderr)
        return 0 if tenant_report.ok else 1
    report = verify_export(args.export, pubkey=args.pubkey, since=args.since, progress=not args.json)
    if args.json:
        out = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in vars(report).items()}
        print(json.dumps(out, indent=2))
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
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
    check = verify_receipt(data, _load_text(args.pubkey, "public key"))
    if check.ok:
        print(f"receipt OK: forget {data.get('request_id')} of {data.get('ref')} (tenant {data.get('tenant') or '-'}) "
              f"is logged at {data.get('log_index')} under the pinned key")
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
