"""``fak mcp list`` and ``fak mcp approve LABEL``: the deployment's MCP servers and their pinned
tools, from a running server over HTTP (``GET /v1/mcp/servers``, ``POST
/v1/mcp/servers/{label}/approve``) with an admin key of the operator tenant. ``approve`` shows
what it is about to pin (the tools' digests, and the description of every tool not pinned as
it is now), asks before pinning (``--yes`` answers; a shell without a terminal must give it),
and pins exactly the listing shown: if the server changed in between, nothing is pinned
(409) and the command says so. Only ``httpx``: it runs in a client-only install."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from fak.errors import FakError

DEFAULT_URL = "http://127.0.0.1:8077"  # ``fak serve``'s default address


class McpCliError(FakError):
    """The server refused or could not be reached (the message says which, never the key)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("mcp", help="the deployment's MCP servers: list their tools, approve (pin) them")
    sub = p.add_subparsers(dest="mcp_command", metavar="ACTION")

    ls = sub.add_parser("list", help="every declared MCP server, its tools as listed now, their status against "
                        "the pins, who approved them")
    _server_args(ls)
    ls.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    ls.set_defaults(handler=_list)

    ap = sub.add_parser("approve", help="pin a server's tools as it lists them now (shown first, then asked)")
    ap.add_argument("label", help="the server's label in mcp_servers")
    _server_args(ap)
    ap.add_argument("--yes", action="store_true", help="pin without asking (required without a terminal)")
    ap.add_argument("--json", action="store_true", help="print the approval as JSON")
    ap.set_defaults(handler=_approve)

    def _help(_args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(handler=_help)


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"the fak server (default {DEFAULT_URL})")
    p.add_argument("--key", required=True, metavar="API_KEY",
                   help="an admin key of the operator tenant, or @FILE to read it from a file")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="longest wait for the server (a listing asks every MCP server)")


def _key(value: str) -> str:
    if value.startswith("@"):
        return Path(value[1:]).read_text(encoding="utf-8").strip()
    return value


def _request(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    headers = {"Authorization": f"Bearer {_key(args.key)}"}
    try:
        with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=args.timeout,
                          trust_env=False) as c:
            r = c.request(method, path, json=body)
    except httpx.HTTPError as exc:
        raise McpCliError(f"{method} {args.url.rstrip('/')}{path}: {exc}") from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail") or r.text
        except ValueError:
            detail = r.text
        raise McpCliError(f"{method} {path}: {r.status_code}: {str(detail)[:2000]}")
    return r.json()


def _servers(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = _request(args, "GET", "/v1/mcp/servers")["servers"]
    return out


def _status(tool: dict[str, Any]) -> str:
    if tool["status"] == "changed":
        return f"changed ({tool['change']}; pinned {tool['pinned_digest']})"
    return str(tool["status"])


def _print_server(server: dict[str, Any], descriptions: bool = False, file: TextIO | None = None) -> None:
    """One server as ``fak mcp list`` shows it; with ``descriptions``, the description and schema
    of every tool not pinned as it is now (what an operator reviews before approving)."""
    lines = []
    allowed = f"; allowed_tools: {', '.join(server['allowed_tools'])}" if server["allowed_tools"] else ""
    lines.append(f"{server['label']}  {server['source']}{allowed}")
    if server["tools"] is None:
        lines.append(f"  unreachable: {server['error']}")
    elif not server["tools"]:
        lines.append("  (lists no tools)")
    for t in server["tools"] or ():
        lines.append(f"  {t['name']:<32} {t['digest']}  {_status(t)}")
        if descriptions and t["status"] != "pinned":
            lines += [f"      | {line}" for line in (t["description"] or "(no description)").splitlines()]
            lines.append(f"      | input schema: {json.dumps(t['input_schema'], sort_keys=True)[:2000]}")
    pins = server["pins"]
    if pins:
        by = sorted({(p["approved_by"], p["audit_index"]) for p in pins})
        lines.append(f"  pinned: {len(pins)} tool(s), approved by "
                     + ", ".join(f"{who} (audit entry {i})" for who, i in by))
    else:
        lines.append("  pinned: nothing (no tool of this server is offered to models)")
    print("\n".join(lines), file=file or sys.stdout)


def _list(args: argparse.Namespace) -> int:
    servers = _servers(args)
    if args.json:
        print(json.dumps({"servers": servers}, indent=2))
        return 0
    if not servers:
        print("no MCP servers are declared (settings: mcp_servers)")
    for i, server in enumerate(servers):
        if i:
            print()
        _print_server(server)
    return 0


def _approve(args: argparse.Namespace) -> int:
    server = next((s for s in _servers(args) if s["label"] == args.label), None)
    if server is None:
        raise McpCliError(f"no MCP server {args.label!r} is declared by this deployment")
    if server["tools"] is None:
        raise McpCliError(f"MCP server {args.label} cannot be listed now, nothing to approve: {server['error']}")
    _print_server(server, descriptions=True, file=sys.stderr if args.json else sys.stdout)
    digests = [t["digest"] for t in server["tools"]]
    if not args.yes:
        if not sys.stdin.isatty():
            raise McpCliError("not a terminal: review the listing above, then run again with --yes to pin it")
        answer = input(f"Pin these {len(digests)} tool(s) of {args.label} as listed? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing pinned", file=sys.stderr)
            return 1
    done = _request(args, "POST", f"/v1/mcp/servers/{args.label}/approve", {"expected": digests})
    if args.json:
        print(json.dumps(done, indent=2))
        return 0
    print(f"pinned {len(done['tools'])} tool(s) of {done['label']} (audit entry {done['audit_index']}):")
    for t in done["tools"]:
        print(f"  {t['name']:<32} {t['digest']}")
    return 0
