"""``fak witness serve|pubkey`` (a C2SP tlog-witness) and ``fak audit signer-reset`` (the
operator's explicit resolution of a signer alarm, itself logged)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fak.audit.cli import prints_help
from fak.cli_options import add_config, add_database_url


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = subparsers.add_parser("witness", help="a witness that cosigns audit checkpoints (C2SP tlog-witness)")
    sub = w.add_subparsers(dest="witness_command", metavar="ACTION")
    s = sub.add_parser("serve", help="cosign consistent checkpoints of the given logs over HTTP")
    s.add_argument("--dir", help="the witness's key and remembered state (default: <data dir>/witness)")
    s.add_argument("--log", action="append", default=[], metavar="VKEY",
                   help="a log's verifier key (as 'fak audit pubkey' prints it); repeatable")
    s.add_argument("--listen", default="127.0.0.1:7380", help="host:port (default loopback 127.0.0.1:7380)")
    s.add_argument("--name", help="the witness's key name on first start (default fak.local/witness)")
    add_config(s)
    s.set_defaults(handler=_serve)
    k = sub.add_parser("pubkey", help="print the witness's cosignature verifier key (creating the key)")
    k.add_argument("--dir", help="the witness's key (default: <data dir>/witness)")
    k.add_argument("--name", help="the key name on first use (default fak.local/witness)")
    add_config(k)
    k.set_defaults(handler=_pubkey)

    w.set_defaults(handler=prints_help(w))

    audit = subparsers.choices.get("audit")
    # argparse has no public handle on an existing parser's subcommands: find its subparsers action
    actions = [a for a in getattr(audit, "_actions", []) if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if actions:
        r = actions[0].add_parser("signer-reset", help="OPERATOR ACTION: accept the log's current history after "
                                  "a signer alarm (logged as an AuditAlarm of kind signer_reset)")
        r.add_argument("--accept-size", type=int, required=True, metavar="N",
                       help="the entries [0, N) become what the signer remembers (checked by you first)")
        r.add_argument("--principal", help="who resolves it (recorded in the log)")
        add_config(r)
        add_database_url(r)
        r.set_defaults(handler=_signer_reset)


def _dir(args: argparse.Namespace) -> Path:
    from fak.settings import StorageSettings

    return Path(args.dir) if args.dir else StorageSettings().data_dir / "witness"


def _pubkey(args: argparse.Namespace) -> int:
    from fak.audit.witness import load_key

    print(load_key(_dir(args), args.name).vkey())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from fak.audit.errors import AuditError
    from fak.audit.witness import Witness, WitnessServer

    if not args.log:
        raise AuditError("give at least one --log VKEY: a witness cosigns only logs it knows")
    host, _, port = args.listen.rpartition(":")
    witness = Witness(_dir(args), args.log, args.name)
    server = WitnessServer(witness, host or "127.0.0.1", int(port))
    print(f"witness {witness.vkey()} listening on {server.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.close()


def _signer_reset(args: argparse.Namespace) -> int:
    from fak.audit import AuditLog, note

    with AuditLog.open(url=args.url) as log:
        size, root = log.reset_signer(args.accept_size, principal=args.principal)
        print(f"signer reset: accepted {size} entries, root {note.b64(root)}", file=sys.stderr)
        cp = log.checkpoint()
        sys.stdout.write(cp.note)
    return 0
