"""``fak cas ...``: put, get, head, forget, rotate-kek, fsck against the store of
the data directory (or ``--url``)."""

from __future__ import annotations

import argparse
import json
import sys


def _store(args):
    from fak.cas.store import CasStore

    return CasStore.open(url=args.url)


def _put(args) -> int:
    from fak.cas.errors import CasError

    with _store(args) as store:
        if args.file == "-":
            ref = store.put_stream(sys.stdin.buffer, args.media_type, args.tenant, keyed=not args.public, taint=args.taint)
        else:
            try:
                fh = open(args.file, "rb")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise CasError(f"cannot read {args.file}: {exc.strerror}") from exc
            with fh:
                ref = store.put_stream(fh, args.media_type, args.tenant, keyed=not args.public, taint=args.taint)
    print(ref.model_dump_json())
    return 0


def _get(args) -> int:
    with _store(args) as store:
        out = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115
        try:
            for piece in store.get_stream(args.digest, args.tenant):
                out.write(piece)
        finally:
            if args.output:
                out.close()
    return 0


def _head(args) -> int:
    from fak.cas.errors import NotFound

    with _store(args) as store:
        ref = store.head(args.digest, args.tenant)
    if ref is None:
        raise NotFound(f"no ref {args.digest} for tenant {args.tenant!r}")
    print(ref.model_dump_json())
    return 0


def _forget(args) -> int:
    with _store(args) as store:
        print(store.forget(args.digest, args.tenant).model_dump_json())
    return 0


def _rotate(args) -> int:
    with _store(args) as store:
        version, count = store.rotate_kek()
    print(json.dumps({"kek_version": version, "rewrapped": count}))
    return 0


def _fsck(args) -> int:
    with _store(args) as store:
        report = store.fsck(remove_orphans=args.remove_orphans)
    print(report.model_dump_json())
    return 1 if report.missing or report.wrong_size else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    cas = subparsers.add_parser("cas", help="content-addressed store of tool results")
    cas.add_argument("--url", help="SQLAlchemy database URL (default: FAK_DATABASE_URL or the data dir)")
    sub = cas.add_subparsers(dest="cas_command", metavar="ACTION", required=True)

    def cmd(name: str, fn, help: str, digest: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        if digest:
            p.add_argument("digest")
        p.add_argument("--tenant", default="default")
        p.set_defaults(handler=fn)
        return p

    p = cmd("put", _put, "store a file ('-' for stdin); prints the ref as JSON", digest=False)
    p.add_argument("file")
    p.add_argument("--media-type", default="application/octet-stream")
    p.add_argument("--taint", default="untrusted", choices=["untrusted", "trusted", "quarantined"])
    p.add_argument("--public", action="store_true", help="public blake3 digest instead of the keyed one")
    cmd("get", _get, "write a blob's verified bytes to stdout or -o FILE").add_argument("-o", "--output")
    cmd("head", _head, "print a ref as JSON")
    cmd("forget", _forget, "erase a blob (destroy its key and ciphertext); prints the shred record")
    p = cmd("rotate-kek", _rotate, "re-wrap every data key under a new KEK version", digest=False)
    p = cmd("fsck", _fsck, "check blob files against the database", digest=False)
    p.add_argument("--remove-orphans", action="store_true", help="delete orphan blobs older than an hour")
