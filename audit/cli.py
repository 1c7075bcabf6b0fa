"""``fak audit ...``: export, verify, checkpoint, proof, pubkey."""

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
    from fak.audit.verify import verify_export

    report = verify_export(args.export, pubkey=args.pubkey, since=args.since)
    if args.json:
        out = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in vars(report).items()}
        print(json.dumps(out, indent=2))
    else:
        print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


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
