"""``fak serve`` (the API on uvicorn) and ``fak keys create|list|revoke``."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="serve the REST and OpenAI-compatible API")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8077)
    serve.add_argument("--config", help="settings file (TOML or YAML); FAK_* variables override it")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=_serve)

    keys = subparsers.add_parser("keys", help="API keys (stored hashed; a key is printed once)")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION")
    c = ksub.add_parser("create", help="create a key for a tenant and role; prints it once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--role", required=True, choices=("agent", "auditor", "admin"))
    c.add_argument("--name", help="a label for the key")
    c.add_argument("--config")
    c.add_argument("--json", action="store_true")
    c.set_defaults(handler=_create)
    ls = ksub.add_parser("list", help="key ids, tenants, roles (never the keys)")
    ls.add_argument("--tenant")
    ls.add_argument("--config")
    ls.set_defaults(handler=_list)
    rv = ksub.add_parser("revoke", help="revoke a key by id")
    rv.add_argument("key_id")
    rv.add_argument("--config")
    rv.set_defaults(handler=_revoke)
    keys.set_defaults(handler=lambda _a: (keys.print_help(), 2)[1])


def _key_store(config: str | None):  # noqa: ANN202
    from fak.api.keys import HASH_LABEL, KeyStore
    from fak.db import make_engine
    from fak.keys import derive_key, load_master_secret
    from fak.settings import Settings
    from fak.state.store import upgrade

    settings = Settings.load(config)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url)
    upgrade(engine)
    return KeyStore(engine, derive_key(load_master_secret(settings.data_dir), HASH_LABEL)), engine


def _create(args: argparse.Namespace) -> int:
    store, engine = _key_store(args.config)
    try:
        key, who = store.create(args.tenant, args.role, args.name)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"key": key, "key_id": who.key_id, "tenant": who.tenant, "role": who.role.value}))
    else:
        print(key)
        print(f"(key id {who.key_id}, tenant {who.tenant}, role {who.role.value}; shown once, store it now)",
              file=__import__("sys").stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    store, engine = _key_store(args.config)
    try:
        for row in store.list(args.tenant):
            state = "revoked" if row.revoked_us else "active"
            print(f"{row.key_id}  {row.tenant:<24} {row.role:<8} {state}  {row.name or ''}")
    finally:
        engine.dispose()
    return 0


def _revoke(args: argparse.Namespace) -> int:
    store, engine = _key_store(args.config)
    try:
        store.revoke(args.key_id)
    finally:
        engine.dispose()
    print(f"revoked {args.key_id}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from fak.api.app import create_app
    from fak.api.malloc import limit_arenas
    from fak.facade import Kernel
    from fak.settings import Settings

    limit_arenas()  # before any worker thread allocates (api/malloc.py says why)
    kernel = Kernel.open(Settings.load(args.config))
    try:
        uvicorn.run(create_app(kernel), host=args.host, port=args.port, log_level=args.log_level,
                    timeout_graceful_shutdown=10)
    finally:
        kernel.close()
    return 0
