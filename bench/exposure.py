"""What three readers can still read that they should not (issue 41, item 6), as figures.

1. An auditor key reads a stored response (``GET /v1/responses/{id}``): how many of its
   content fields (instructions, output text, function-call arguments) come back non-empty,
   and whether a secret in the instructions shows.
2. A console cookie captured before its session signed out, presented after the sign-out on
   the same server and on a server restarted over the same database (and, for contrast, a
   cookie of a session that did not sign out).
3. Another tenant's auditor key asks for the log's first level-0 hash tile (every entry's
   leaf hash): the status and how many leaf hashes it gets.

A tiny model on loopback, one process; the numbers are counts and statuses, not timings.
    python bench/exposure.py [--json out.json]
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from common import ROOT, parser, report, target

sys.path.insert(0, str(ROOT / "tests"))
from support.tiny_kernel import make_tiny_model_dir  # noqa: E402 - tests/ is a fixture folder

from fak import Kernel, Settings  # noqa: E402
from fak.api.server import LiveServer, serve  # noqa: E402
from fak.audit import PolicyLoaded  # noqa: E402

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SECRET = "4711"
PAY = {"type": "function", "name": "pay", "description": "Pay an amount", "strict": True,
       "parameters": {"type": "object", "properties": {"amount": {"type": "integer", "enum": [5]}},
                      "required": ["amount"], "additionalProperties": False}}


def browser(url: str) -> httpx.Client:
    """Keeps cookies as a browser does on 127.0.0.1, where Secure cookies are sent over http."""
    b = httpx.Client(base_url=url, trust_env=False, follow_redirects=False)

    def loopback_is_secure(_response: httpx.Response) -> None:
        for kept in b.cookies.jar:
            kept.secure = False

    b.event_hooks["response"].append(loopback_is_secure)
    return b


def sign_in(live: LiveServer, key: str) -> tuple[httpx.Client, str, str]:
    """A signed-in console client, its session cookie's name and value."""
    b = browser(live.url)
    token = CSRF.search(b.get("/console/login").text)
    assert token is not None
    r = b.post("/console/login", data={"key": key, "csrf": token.group(1)})
    assert r.status_code == 303, r.text[:300]
    name = next(h.split("=", 1)[0] for h in r.headers.get_list("set-cookie") if "fak_console=" in h)
    return b, name, b.cookies[name]


def presented(url: str, name: str, value: str) -> int:
    """The status of the sessions page for someone holding only this cookie value."""
    with httpx.Client(base_url=url, trust_env=False, follow_redirects=False) as c:
        c.cookies.set(name, value, domain="127.0.0.1", path="/")
        return c.get("/console/sessions").status_code


def content_read(live: LiveServer) -> dict[str, Any]:
    agent = live.client(live.key("acme", "agent"))
    r = agent.post("/v1/responses", json={
        "model": "m", "instructions": f"The account PIN is {SECRET}.", "input": "Pay 5.", "tools": [PAY],
        "tool_choice": {"type": "function", "name": "pay"}, "temperature": 0, "max_output_tokens": 160})
    assert r.status_code == 200, r.text[:300]
    with live.client(live.key("acme", "auditor")) as auditor:
        seen = auditor.get(f"/v1/responses/{r.json()['id']}").json()
    agent.close()
    fields: list[Any] = [seen.get("instructions")]
    for o in seen["output"]:
        fields += [o["arguments"]] if o["type"] == "function_call" else [
            p.get("text") for p in o["content"] if p["type"] == "output_text"]
    return {"content_fields": len(fields), "readable": sum(bool(v) for v in fields),
            "secret_shown": SECRET in json.dumps(seen)}


def main() -> None:
    args = parser(__doc__.split("\n\n")[0]).parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        settings = Settings(data_dir=tmp_path / "data", model_path=make_tiny_model_dir(tmp_path / "model"),
                            chunk_size=16, operator_tenant="ops", weights="float32")
        with Kernel.open(settings, progress=None) as k, serve(k) as live:
            results["auditor_reads_response"] = content_read(live)
            out, name, gone = sign_in(live, live.key("acme", "auditor"))
            _other, _name, kept = sign_in(live, live.key("acme", "auditor"))
            before = presented(live.url, name, gone)
            token = CSRF.search(out.get("/console/receipts").text)
            assert token is not None
            out.post("/console/logout", data={"csrf": token.group(1)})
            results["signed_out_cookie"] = {"cookie": name, "before_sign_out": before,
                                            "after_sign_out": presented(live.url, name, gone)}
            for f in [k.audit.submit(PolicyLoaded(policy_id=f"p{i}", policy_digest="sha256:" + "0" * 64,
                                                  tenant="ops")) for i in range(300)]:
                f.result(timeout=60)
            k.audit.checkpoint()
            with live.client(live.key("globex", "auditor")) as other:
                tile = other.get("/v1/audit/log/tile/0/000")
            results["other_tenant_hash_tile"] = {
                "status": tile.status_code, "leaf_hashes": len(tile.content) // 32 if tile.status_code == 200 else 0}
        with Kernel.open(settings, progress=None) as k, serve(k) as live:
            results["signed_out_cookie"]["after_restart"] = presented(live.url, name, gone)
            results["signed_out_cookie"]["other_session_after_restart"] = presented(live.url, name, kept)
    print(json.dumps(results, indent=2))
    cookie = results["signed_out_cookie"]
    report("exposure", results, [
        target("auditor_content_fields_readable", results["auditor_reads_response"]["readable"], 0, "<="),
        target("signed_out_cookie_accepted", int(cookie["after_sign_out"] < 400) + int(cookie["after_restart"] < 400),
               0, "<="),
        target("other_tenant_leaf_hashes", results["other_tenant_hash_tile"]["leaf_hashes"], 0, "<="),
    ], args.json)


if __name__ == "__main__":
    main()
