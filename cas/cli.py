"""``fak cas ...``: put, get, head, forget, rotate, destroy-retired, erase-tenant,
scrub, keks, fsck against the store of the data directory (or ``--database-url``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO

from fak.cli_options import add_config, add_database_url

if TYPE_CHECKING:
    from fak.audit import AuditLog
    from fak.cas.store import CasStore
    from fak.owner import Claim

Handler = Callable[[argparse.Namespace], int]


def _store(args: argparse.Namespace) -> CasStore:
    from fak.cas.store import CasStore

    return CasStore.open(url=_url(args))


def _url(args: argparse.Namespace) -> str | None:
    """``--database-url`` after the action, else ``--url`` before it (the former spelling)."""
    url: str | None = args.url or args.group_url
    return url


def _put(args: argparse.Namespace) -> int:
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


def _get(args: argparse.Namespace) -> int:
    with _store(args) as store:
        if not args.output:
            for piece in store.get_stream(args.digest, args.tenant):
                sys.stdout.buffer.write(piece)
            return 0
        with _private_output(args.output) as out:
            for piece in store.get_stream(args.digest, args.tenant):
                out.write(piece)
    return 0


@contextlib.contextmanager
def _private_output(path: str) -> Iterator[BinaryIO]:
    """A file at ``path`` with mode 0600 (a tool result written out is as private as it was in
    the store), there only once every byte was written and verified: the bytes go to a
    temporary file beside it, renamed over ``path`` at the end and removed if the read fails
    (a forgotten ref or a tampered blob leaves no file, and an existing one untouched)."""
    target = os.path.abspath(path)
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.")
    try:
        with os.fdopen(fd, "wb") as out:  # mkstemp's file is 0600
            yield out
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def duration(text: str) -> float:
    """Seconds from '90', '90s', '15m', '12h' or '7d'."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: e.g. 0, 90s, 15m, 12h, 7d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _head(args: argparse.Namespace) -> int:
    from fak.cas.errors import NotFound

    with _store(args) as store:
        ref = store.head(args.digest, args.tenant)
    if ref is None:
        raise NotFound(f"no ref {args.digest} for tenant {args.tenant!r}")
    print(ref.model_dump_json())
    return 0


def _owned() -> Claim:
    """Claim the data directory (``fak.owner``) for a destructive command that bypasses the
    Kernel: a running server would keep what it erases in its sessions' KV, so while one
    runs this refuses, naming its pid, and the server's own forget is the way."""
    from fak.owner import claim
    from fak.settings import StorageSettings

    return claim(StorageSettings().data_dir, why="forget a ref through its API (POST /v1/forget), or stop it and use "
                 "'fak forget' / 'fak erase-tenant', which also drop the sessions' KV")


def _forget(args: argparse.Namespace) -> int:
    with _owned(), _store(args) as store:
        print(store.forget(args.digest, args.tenant).model_dump_json())
    return 0


@contextlib.contextmanager
def _logged(args: argparse.Namespace) -> Iterator[tuple[CasStore, AuditLog]]:
    """The store and the audit log of the same deployment: key rotations and destructions
    are decisions, logged like every other (``fak.kernel.withdrawal.keys``)."""
    from fak.audit import AuditLog
    from fak.settings import Settings

    settings = Settings.load()
    with _store(args) as store, AuditLog.open(_url(args) or settings.resolved_database_url, settings.data_dir,
                                              origin=settings.audit_origin,
                                              witnesses=settings.audit_witnesses, settings=settings) as audit:
        yield store, audit


def _rotate(args: argparse.Namespace) -> int:
    from fak.kernel.withdrawal import keys as keyops

    with _logged(args) as (store, audit):
        result = keyops.rotate(store, audit, args.tenant, principal="cli")
        out = {"rotation": result.model_dump(mode="json")}
        if args.destroy_after is not None:
            print("fak: retired KEKs are destroyed after the grace period by 'fak cas destroy-retired "
                  f"--older-than {args.destroy_after:g}s'; destroying those already that old now", file=sys.stderr)
            out["destroyed"] = keyops.destroy_retired(store, audit, args.destroy_after,
                                                      principal="cli").model_dump(mode="json")
    print(json.dumps(out))
    return 0


def _destroy(args: argparse.Namespace) -> int:
    from fak.kernel.withdrawal import keys as keyops

    with _logged(args) as (store, audit):
        print(keyops.destroy_retired(store, audit, args.older_than, principal="cli").model_dump_json())
    return 0


def _erase(args: argparse.Namespace) -> int:
    if args.confirm != args.tenant:
        from fak.cas.errors import InvalidInput

        raise InvalidInput(f"erase-tenant destroys every key of {args.tenant!r}: repeat it with --confirm {args.tenant}")
    print("fak: this erases the tenant's CAS keys and refs only; 'fak erase-tenant' also drops its sessions, "
          "KV, ref records and API keys, and logs it", file=sys.stderr)
    with _owned(), _store(args) as store:
        print(store.erase_tenant(args.tenant).model_dump_json())
    return 0


def _scrub(args: argparse.Namespace) -> int:
    with _store(args) as store:
        status = store.scrub()
    print(json.dumps({"shred_status": status}))
    return 0 if status == "destroyed" else 3


def _keks(args: argparse.Namespace) -> int:
    with _store(args) as store:
        for info in store.kek_versions(args.tenant):
            print(info.model_dump_json())
    return 0


def _fsck(args: argparse.Namespace) -> int:
    with _store(args) as store:
        report = store.fsck(remove_orphans=args.remove_orphans)
    print(report.model_dump_json())
    return 1 if report.missing or report.wrong_size or report.keyless else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cas = subparsers.add_parser("cas", help="content-addressed store of tool results")
    cas.add_argument("--url", dest="group_url", help=argparse.SUPPRESS)  # before the action: the former spelling
    sub = cas.add_subparsers(dest="cas_command", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        add_config(p)
        add_database_url(p)
        return p

    def cmd(name: str, fn: Handler, help: str, digest: bool = True) -> argparse.ArgumentParser:
        p = action(name, help)
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
    for name in ("rotate", "rotate-kek"):
        p = action(name, "give every tenant (or --tenant) a new KEK version and re-wrap its data keys"
                   if name == "rotate" else "the format-1 name of 'rotate'")  # fmt: skip
        p.add_argument("--tenant", default=None, help="rotate this tenant only (default: every tenant)")
        p.add_argument("--destroy-after", type=duration, metavar="DURATION",
                       help="then destroy KEKs retired at least this long ago (0: the ones just retired)")  # fmt: skip
        p.set_defaults(handler=_rotate)
    p = action("destroy-retired", "destroy KEKs retired at least --older-than ago (backups older "
               "than their retirement stop opening what was forgotten since)")  # fmt: skip
    p.add_argument("--older-than", type=duration, required=True, metavar="DURATION", help="e.g. 7d, 12h, 0")
    p.set_defaults(handler=_destroy)
    p = action("erase-tenant", "crypto-erase a whole tenant: destroy all its keys, tombstone its refs")
    p.add_argument("tenant")
    p.add_argument("--confirm", required=True, metavar="TENANT", help="the tenant again")
    p.set_defaults(handler=_erase)
    action("scrub", "complete pending scrubs of deleted keys (WAL checkpoint / VACUUM); "
           "exit 3 if still pending").set_defaults(handler=_scrub)  # fmt: skip
    p = action("keks", "list KEK versions (JSON lines)")
    p.add_argument("--tenant", default=None)
    p.set_defaults(handler=_keks)
    p = cmd("fsck", _fsck, "check blob files against the database", digest=False)
    p.add_argument("--remove-orphans", action="store_true", help="delete orphan blobs (and data keys no row names) older than an hour")
