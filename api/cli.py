"""``fak serve`` (the API on uvicorn) and ``fak keys create|list|revoke``."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from fak.cli_options import MODEL_HELP, POLICY_HELP, add_config

if TYPE_CHECKING:  # the handlers import the server only when they run
    from fak.api.keys import KeyStore
    from fak.settings import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = subparsers.add_parser("serve", help="serve the REST and OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8077)
    add_config(serve)
    serve.add_argument("--model", metavar="PATH", help=MODEL_HELP)
    serve.add_argument("--policy", metavar="FILE", help=POLICY_HELP)
    serve.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug",
                                                                "trace"), help="uvicorn's log level (default info)")
    serve.add_argument("--replicas", type=_replicas, default=1, metavar="N",
                       help="run N kernels behind one port on Ray Serve (default 1: this process alone; "
                            "N > 1 needs PostgreSQL and pip install 'fak[scale]')")
    serve.add_argument("--placement", choices=("prefix", "load", "random"), default="prefix",
                       help="with --replicas: where a new conversation goes (default: the replica holding "
                            "most of its prompt in its prefix cache)")
    serve.set_defaults(handler=_serve)

    keys = subparsers.add_parser("keys", help="API keys (stored hashed; a key is printed once)")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    c = ksub.add_parser("create", help="create a key for a tenant and role; prints it once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--role", required=True, choices=("agent", "auditor", "admin", "approver"),
                   help="agent: sessions and chat; auditor: the audit log; approver: a person deciding held tool "
                        "calls; admin: everything of the tenant")
    c.add_argument("--name", help="a label for the key")
    c.add_argument("--expires", type=_duration, metavar="DURATION",
                   help="refuse the key after this long: 90s, 15m, 12h, 30d (default: never)")
    add_config(c)
    c.add_argument("--json", action="store_true", help="print the key and its id as JSON")
    c.set_defaults(handler=_create)
    ls = ksub.add_parser("list", help="key ids, tenants, roles, state and expiry (never the keys); a row "
                                      "edited in the database shows as tampered")
    ls.add_argument("--tenant", help="this tenant's keys only")
    add_config(ls)
    ls.set_defaults(handler=_list)
    rv = ksub.add_parser("revoke", help="revoke a key by id")
    rv.add_argument("key_id")
    add_config(rv)
    rv.set_defaults(handler=_revoke)

    def usage(_args: argparse.Namespace) -> int:  # `fak keys` alone: its subcommands
        keys.print_help()
        return 2

    keys.set_defaults(handler=usage)


def _replicas(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return n


def _duration(text: str) -> float:
    from fak.cas.cli import duration

    return duration(text)


def _key_store(config: str | None, audited: bool) -> AbstractContextManager[KeyStore]:
    """The deployment's key store; ``audited``: with its audit log (creating and revoking log)."""
    from fak.api.keys import open_key_store
    from fak.settings import Settings

    return open_key_store(Settings.load(config), audited=audited)


def _when(us: int | None) -> str:
    import datetime as dt

    return "never" if us is None else dt.datetime.fromtimestamp(us / 1e6, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _create(args: argparse.Namespace) -> int:
    with _key_store(args.config, audited=True) as store:
        key, who = store.create(args.tenant, args.role, args.name, expires_in=args.expires, principal="cli")
    if args.json:
        print(json.dumps({"key": key, "key_id": who.key_id, "tenant": who.tenant, "role": who.role.value,
                          "expires_us": who.expires_us}))
    else:
        print(key)
        print(f"(key id {who.key_id}, tenant {who.tenant}, role {who.role.value}, expires {_when(who.expires_us)}; "
              "shown once, store it now)", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    with _key_store(args.config, audited=False) as store:
        for row in store.list(args.tenant):
            print(f"{row.key_id}  {row.tenant:<24} {row.role:<8} {store.state(row):<8} "
                  f"expires {_when(row.expires_us):<20}  {row.name or ''}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with _key_store(args.config, audited=True) as store:
        store.revoke(args.key_id, principal="cli")
    print(f"revoked {args.key_id}")
    return 0


def _serve_settings(args: argparse.Namespace) -> Settings:
    """The settings ``fak serve`` runs on: its ``--model`` and ``--policy`` flags override the
    settings (``--config`` / ``$FAK_CONFIG`` file, ``FAK_*`` variables), which override the
    defaults; a flag naming no file or folder is refused by name, before anything loads."""
    from pathlib import Path

    from fak.errors import FakError
    from fak.settings import Settings

    overrides: dict[str, Path] = {}
    for flag, field in (("model", "model_path"), ("policy", "policy_path")):
        value: str | None = getattr(args, flag)
        if value is None:
            continue
        path = Path(value).expanduser()
        if not path.exists():
            raise FakError(f"--{flag} {value}: no such file or folder")
        overrides[field] = path
    return Settings.load(args.config, **overrides)


def _serve(args: argparse.Namespace) -> int:
    if args.replicas > 1:
        return _serve_cluster(args)
    settings = _serve_settings(args)
    import uvicorn

    from fak.api.app import create_app
    from fak.api.malloc import limit_arenas
    from fak.api.startup import summary
    from fak.kernel.facade import Kernel

    limit_arenas()  # before any worker thread allocates (api/malloc.py says why)
    kernel = Kernel.open(settings)
    try:
        app = create_app(kernel)
        print("\n".join(summary(kernel, app.state.keys, args.host, args.port)), file=sys.stderr, flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    finally:
        kernel.close()
    return 0


def _serve_cluster(args: argparse.Namespace) -> int:
    """``fak serve --replicas N``: the kernels on Ray Serve behind one port until Ctrl-C."""
    import importlib.util
    import signal
    import sys
    import threading

    from fak.api.cluster.lifecycle import RAY_MISSING, run_cluster, shutdown_cluster, wait_ready
    from fak.api.cluster.rules import Placement
    from fak.kernel.facade import check_replicated

    settings = _serve_settings(args)
    check_replicated(settings, args.replicas)  # before Ray starts: a clear error, not N failing actors
    if importlib.util.find_spec("ray") is None:
        print(f"fak: {RAY_MISSING}", file=sys.stderr)
        return 2
    stop = threading.Event()
    # both stop it, also when started in the background (a shell's `&` starts it with SIGINT ignored)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        run_cluster(settings, args.replicas, args.host, args.port, Placement(args.placement))
        ready = wait_ready(f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}")
        print(f"fak: {args.replicas} replicas on http://{args.host}:{args.port} ({args.placement} placement; "
              f"router ready {ready:.1f} s after the kernels)", file=sys.stderr, flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        shutdown_cluster()
    return 0
