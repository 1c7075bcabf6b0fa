"""MCP benchmark (issue 47): what fak's MCP paths add over calling the MCP server directly,
measured in one run against real MCP servers on loopback (the official SDK's ``MCPServer``:
``tests/support/mcp_servers.py``'s ``MailServer``, and a variant listing ``--tools`` (100) tools),
served by a process of their own (this file with ``--upstream``).

fak is ``fak.api.server.serve(kernel)`` (what ``fak serve`` runs: uvicorn, the real app, real
HTTP on loopback) in this process, on the tiny test model (``tests/support/tiny_kernel.py``:
random weights, a byte-level tokenizer; the model's run is not what is measured here), its
deployment declaring both servers, their tools pinned by an operator. The client is the
official SDK's ``Client`` over streamable HTTP.

* ``tools/call``, ``--calls`` (200) pairs, the order alternating: ``read_inbox`` straight to the
  upstream (direct), and the same call through fak's ``/mcp`` gateway (a policy rule allows it),
  each gateway call bound (``_meta`` ``fak.dev/session``) to a fresh fak session made before the
  pair (untimed: the result is admitted into it, and one session would fill the tiny model's
  context). In the same pairs, in process and in a fresh session of the same kind: the
  decision alone (``KernelSession.authorize_tool_call`` of the same call, logged) and the
  admission of the same result bytes alone (``KernelSession.admit``), so that

      overhead = gateway p50 - direct p50 - admission p50

  is what the gateway adds besides the admission of the result (the decision, its audit
  append, the MCP framing and the forwarding hop are in it). Measured with the gateway
  answering with SSE (the SDK's default) and with plain JSON (``json_response``), each from a
  connection of its own.
* A Responses MCP round trip, ``--responses`` (20) trios: ``POST /v1/responses`` with the
  server as an ``mcp`` tool (``require_approval: never``, ``allowed_tools: [read_inbox]``,
  ``tool_choice`` forcing ``read_inbox``): fak lists the server, the model writes the call, fak
  decides and runs it, admits the result and the model answers; against the same done by a
  client: the same server's tool as a function tool, the forced call returned to the client,
  the client calls the server itself (SDK, direct) and sends the result back with
  ``previous_response_id`` for the answer; the client lists the server's tools first (fak lists
  them per response, as an Agents SDK client does per run), and the same without that listing
  is reported too. Both answers get the same token budget (the call's
  tokens plus ``--answer-tokens``, temperature 0); the output tokens of both are reported.
* The pin check per request at ``--tools`` tools: ``ToolPins.check`` of the server's listing
  (already listed, its ``McpTool`` objects reused, as the gateway's listing cache does), the same
  on a freshly listed copy (each tool's digest computed once), and the whole listing plus check
  (``McpServers.offer``: a ``tools/list`` round trip to the server and the check).

Targets (same run): gateway overhead p50 (as above) <= 2 ms; the Responses MCP round trip p50
<= the client-made round trip's p50, its listing included (ratio <= 1.0: fak saves the
client's second request and does the same listing, decision and result admission, plus the
admission of the definitions, which the client-made trip lacks); the pin check at
100 tools p50 <= 0.2 ms.

    cd bench && ../.venv/bin/python mcp.py --json out/mcp.json [--calls 200 --responses 20]
    ../.venv/bin/python mcp.py --quick   # a smoke run: 20 pairs, 4 round trips
"""

from __future__ import annotations

import sys

if __name__ == "mcp":  # imported as the SDK by a process with bench/ on its path: load the real package instead
    import importlib.machinery
    import importlib.util
    import os.path

    _spec = importlib.machinery.PathFinder.find_spec("mcp", [
        p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))])
    assert _spec is not None and _spec.loader is not None
    sys.modules["mcp"] = _real = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_real)

import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import ROOT, log, parser, report, target

if __name__ == "__main__":  # this file's name is the SDK's: bench/ off the path, so that ``import mcp`` is the SDK
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT / "tests"))

TENANT = "acme"
POLICY = """\
apiVersion: fak.dev/v1
kind: Policy
metadata: {name: bench-mcp}
spec:
  mode: enforce
  defaults: {trust: untrusted, verdict: ALLOW}
  tool_calls:
    unlisted: CONFIRM
    rules:
      - {id: reads, tools: ["mcp:mail/read_inbox", "read_inbox"], verdict: ALLOW}
"""
TOOL = "read_inbox"


# --- the upstream process ----------------------------------------------------------------------
def upstream(tools: int) -> int:
    """Serve the MailServer and a server of ``tools`` tools; print their URLs; run until stdin ends."""
    from support.mcp_servers import MailServer, running

    many = MailServer()
    for i in range(tools - 4):  # the MailServer's four, and lookups
        def lookup(query: str, limit: int = 10, i: int = i) -> str:
            return f"lookup {i}: nothing for {query!r} (limit {limit})"

        many.server.add_tool(lookup, name=f"lookup_{i:03d}",
                             description=f"Look up records of kind {i:03d} by a free-text query; returns at most "
                                         "`limit` matches, newest first.")
    with running(MailServer()) as mail, running(many) as big:
        print(json.dumps({"mail": mail.url, "many": big.url}), flush=True)
        sys.stdin.read()
    return 0


# --- helpers ---------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def ms(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs) * 1e3, "p90": pct(xs, 0.9) * 1e3, "n": len(xs)}


def mcp_client(url: str, headers: dict[str, str] | None = None) -> Any:
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers=headers or {}, timeout=httpx2.Timeout(30))
    return Client(streamable_http_client(url, http_client=http), raise_exceptions=True)


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = await fn()
    return time.perf_counter() - t0, out


def text_of(result: Any) -> str:
    return "".join(getattr(b, "text", "") for b in result.content)


# --- the measurements --------------------------------------------------------------------------
async def calls(k: Any, live: Any, urls: dict[str, str], n: int) -> dict[str, Any]:
    """Direct vs gateway tools/call pairs, SSE then JSON answers from the gateway; the decision
    and the admission alone in the same pairs."""
    from fak.kernel.calls.tool_text import ToolSpec
    from fak.kernel.mcp.servers import provenance

    endpoint = live.app.state.mcp_gateway
    key = live.key(TENANT, "agent")
    auth = {"Authorization": f"Bearer {key}"}
    governed = provenance("mail", TOOL)
    out: dict[str, Any] = {}
    async with mcp_client(live.url + "/mcp", auth) as first:  # starts the gateway's session manager
        await first.list_tools()
    async with mcp_client(urls["mail"]) as direct:
        await direct.list_tools()
        await direct.call_tool(TOOL, {})
        for mode in ("sse", "json"):
            endpoint.manager.json_response = mode == "json"  # read per new connection (and 2026 request)
            d, g, admit, decide, listing = [], [], [], [], []
            async with mcp_client(live.url + "/mcp", auth) as gw:
                for _ in range(3):  # warm-up
                    await gw.list_tools()
                    await gw.call_tool(TOOL, {}, meta={"fak.dev/session": k.create_session(TENANT).id})
                body = None
                for i in range(n):
                    sid = k.create_session(TENANT).id
                    pair = [("d", lambda: direct.call_tool(TOOL, {})),
                            ("g", lambda sid=sid: gw.call_tool(TOOL, {}, meta={"fak.dev/session": sid}))]
                    for which, fn in pair if i % 2 == 0 else pair[::-1]:
                        dt, r = await timed(fn)
                        assert not r.is_error, text_of(r)
                        (d if which == "d" else g).append(dt)
                        if which == "g":
                            meta = dict(r.meta or {})
                            assert meta.get("fak.dev/verdict") == "ALLOW" and meta.get("fak.dev/ref"), meta
                            body = text_of(r).encode()
                    # the kernel's part alone, in a fresh session as the gateway's call had
                    ks = k.create_session(TENANT)
                    spec = ToolSpec(governed, "Read the messages in the inbox.", {"type": "object", "properties": {}},
                                    False)
                    t0 = time.perf_counter()
                    v = ks.authorize_tool_call(governed, {}, principal="bench", tool=spec)
                    decide.append(time.perf_counter() - t0)
                    assert v.verdict == "ALLOW"
                    assert body is not None
                    t0 = time.perf_counter()
                    a = ks.admit(governed, body, media_type="text/plain", source=urls["mail"])
                    admit.append(time.perf_counter() - t0)
                    assert a.admitted
                    if i % 10 == 0:
                        dt, _ = await timed(gw.list_tools)
                        listing.append(dt)
            res = {"direct_ms": ms(d), "gateway_ms": ms(g), "authorize_ms": ms(decide), "admit_ms": ms(admit),
                   "gateway_tools_list_ms": ms(listing)}
            res["overhead_p50_ms"] = (res["gateway_ms"]["p50"] - res["direct_ms"]["p50"] - res["admit_ms"]["p50"])
            res["overhead_minus_authorize_p50_ms"] = res["overhead_p50_ms"] - res["authorize_ms"]["p50"]
            res["paired_added_p50_ms"] = statistics.median(x - y for x, y in zip(g, d, strict=True)) * 1e3
            out[mode] = res
            log(f"tools/call [{mode}]: direct p50 {res['direct_ms']['p50']:.2f} ms, gateway p50 "
                f"{res['gateway_ms']['p50']:.2f} ms, admit {res['admit_ms']['p50']:.2f} ms, authorize "
                f"{res['authorize_ms']['p50']:.2f} ms: overhead {res['overhead_p50_ms']:.2f} ms")
    return out


async def responses(k: Any, live: Any, urls: dict[str, str], n: int, answer: int) -> dict[str, Any]:
    """fak's Responses MCP round trip vs the same round trip made by a client."""
    import httpx

    key = live.key(TENANT, "agent")
    schema = {"type": "object", "properties": {}}
    mcp_tool = {"type": "mcp", "server_label": "mail", "server_url": urls["mail"], "require_approval": "never",
                "allowed_tools": [TOOL]}
    fn_tool = {"type": "function", "name": TOOL, "description": "Read the messages in the inbox.",
               "parameters": schema}
    ask = "What is in my inbox?"

    async with httpx.AsyncClient(base_url=live.url + "/v1", headers={"Authorization": f"Bearer {key}"},
                                 timeout=120, trust_env=False) as h, mcp_client(urls["mail"]) as direct:
        await direct.list_tools()

        async def post(body: dict[str, Any]) -> dict[str, Any]:
            r = await h.post("/responses", json=body)
            assert r.status_code == 200, r.text
            return dict(r.json())

        probe = await post({"model": "fak", "input": ask, "temperature": 0, "max_output_tokens": 256,
                            "tools": [fn_tool], "tool_choice": {"type": "function", "name": TOOL}})
        call_tokens = int(probe["usage"]["output_tokens"])
        budget = call_tokens + answer

        async def by_fak() -> dict[str, Any]:
            return await post({"model": "fak", "input": ask, "temperature": 0, "max_output_tokens": budget,
                               "tools": [mcp_tool], "tool_choice": {"type": "mcp", "server_label": "mail",
                                                                    "name": TOOL}})

        async def by_client(listing: bool = True) -> dict[str, Any]:
            if listing:  # as fak does per response, and an Agents SDK client per run (cache_tools_list off)
                await direct.list_tools()
            first = await post({"model": "fak", "input": ask, "temperature": 0, "max_output_tokens": budget,
                                "tools": [fn_tool], "tool_choice": {"type": "function", "name": TOOL}})
            call = next(o for o in first["output"] if o["type"] == "function_call")
            result = await direct.call_tool(call["name"], json.loads(call["arguments"] or "{}"))
            second = await post({"model": "fak", "previous_response_id": first["id"], "temperature": 0,
                                 "max_output_tokens": budget - int(first["usage"]["output_tokens"]),
                                 "tools": [fn_tool], "input": [{"type": "function_call_output",
                                                                "call_id": call["call_id"],
                                                                "output": text_of(result)}]})
            second["usage"]["output_tokens"] += first["usage"]["output_tokens"]
            return second

        for _ in range(2):  # warm-up
            await by_fak()
            await by_client()
        f, c, u, f_tokens, c_tokens = [], [], [], [], []
        for i in range(n):
            trio = [("f", by_fak), ("c", by_client), ("u", lambda: by_client(False))]
            for which, fn in trio[i % 3:] + trio[:i % 3]:
                dt, r = await timed(fn)
                if which == "f":
                    assert any(o["type"] == "mcp_call" and o.get("error") is None for o in r["output"]), r["output"]
                    f.append(dt)
                    f_tokens.append(int(r["usage"]["output_tokens"]))
                else:
                    (c if which == "c" else u).append(dt)
                    c_tokens.append(int(r["usage"]["output_tokens"]))
    res = {"fak_ms": ms(f), "client_made_ms": ms(c), "client_made_without_listing_ms": ms(u),
           "call_tokens": call_tokens, "answer_budget_tokens": answer,
           "fak_output_tokens_p50": statistics.median(f_tokens), "client_output_tokens_p50": statistics.median(c_tokens)}
    res["ratio_p50"] = res["fak_ms"]["p50"] / res["client_made_ms"]["p50"]
    res["ratio_without_listing_p50"] = res["fak_ms"]["p50"] / res["client_made_without_listing_ms"]["p50"]
    log(f"responses: fak p50 {res['fak_ms']['p50']:.1f} ms, client-made p50 {res['client_made_ms']['p50']:.1f} ms "
        f"({res['client_made_without_listing_ms']['p50']:.1f} without its tools/list), "
        f"ratio {res['ratio_p50']:.3f} (tokens {res['fak_output_tokens_p50']} / {res['client_output_tokens_p50']})")
    return res


def pins(k: Any, url: str, reps: int) -> dict[str, Any]:
    """The pin check per request at the big server's tool count, and listing + check."""
    from fak import Settings
    from fak.kernel.mcp.client import McpTool
    from fak.kernel.mcp.servers import McpServers

    # the big server is not the gateway's (its definitions would pass the tiny model's context):
    # a McpServers of its own over the kernel's state, log and pin key
    s = k.services
    servers = McpServers.from_settings(Settings(data_dir=k.settings.data_dir, mcp_servers={
        "many": {"url": url, "timeout_s": 10}}), s.state, s.audit, s.keys.derive("fak/mcp/pins"))
    servers.approve("many", "operator-bench")
    listed = servers.tools("many")
    n = len(listed)
    for _ in range(20):
        check = servers.pins.check("many", listed)
    assert len(check.offered) == n and not check.withheld
    cached, fresh, offer = [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        servers.pins.check("many", listed)
        cached.append(time.perf_counter() - t0)
        copy = [McpTool(t.name, t.description, t.input_schema, t.annotations) for t in listed]
        t0 = time.perf_counter()
        servers.pins.check("many", copy)
        fresh.append(time.perf_counter() - t0)
    for _ in range(max(20, reps // 10)):
        t0 = time.perf_counter()
        o = servers.offer("many")
        offer.append(time.perf_counter() - t0)
        assert len(o.offered) == n
    servers.close()
    res = {"tools": n, "check_ms": ms(cached), "check_fresh_listing_ms": ms(fresh), "list_and_check_ms": ms(offer)}
    log(f"pins at {n} tools: check p50 {res['check_ms']['p50']:.4f} ms (fresh listing "
        f"{res['check_fresh_listing_ms']['p50']:.3f} ms), listing + check p50 {res['list_and_check_ms']['p50']:.2f} ms")
    return res


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--upstream", type=int, metavar="TOOLS", help=argparse_suppress())
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--responses", type=int, default=20)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--tools", type=int, default=100)
    p.add_argument("--pin-reps", type=int, default=2000)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.upstream is not None:
        return upstream(args.upstream)
    if args.quick:
        args.calls, args.responses, args.pin_reps = 20, 4, 200

    from support.tiny_kernel import make_tiny_model_dir

    from fak import Kernel, Settings
    from fak.api.server import serve
    from fak.kernel.model.loader import load_model

    proc = subprocess.Popen([sys.executable, __file__, "--upstream", str(args.tools)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    try:
        assert proc.stdout is not None
        urls = json.loads(proc.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="fak-bench-mcp-") as tmp:
            tiny = make_tiny_model_dir(Path(tmp) / "tiny")
            policy = Path(tmp) / "policy.yaml"
            policy.write_text(POLICY)
            k = Kernel.open(Settings(data_dir=Path(tmp) / "data", model_path=tiny, chunk_size=16, policy_path=policy,
                                     mcp_servers={"mail": {"url": urls["mail"], "timeout_s": 10}}),
                            model=load_model(tiny), progress=None)
            try:
                assert k.services.mcp is not None
                k.services.mcp.approve("mail", "operator-bench")
                with serve(k) as live:
                    results: dict[str, Any] = {"model": "tiny (tests/support/tiny_kernel.py)",
                                               "upstream": "tests/support/mcp_servers.py MailServer, own process"}
                    results["pins"] = pins(k, urls["many"], args.pin_reps)
                    results["tools_call"] = asyncio.run(calls(k, live, urls, args.calls))
                    results["responses"] = asyncio.run(responses(k, live, urls, args.responses, args.answer_tokens))
            finally:
                k.close()
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(10)
    tc = results["tools_call"]
    best = min(("sse", "json"), key=lambda m: float(tc[m]["overhead_p50_ms"]))
    results["tools_call"]["answer_mode_served"] = "json" if _served_json() else "sse"
    served = results["tools_call"]["answer_mode_served"]
    targets = [
        target(f"gateway overhead p50 past direct and admission, as served ({served}) (ms)",
               tc[served]["overhead_p50_ms"], 2.0, "<="),
        target("Responses MCP round trip p50 / client-made p50", results["responses"]["ratio_p50"], 1.0, "<="),
        target(f"pin check p50 at {results['pins']['tools']} tools (ms)", results["pins"]["check_ms"]["p50"], 0.2,
               "<="),
    ]
    results["tools_call"]["lower_overhead_mode"] = best
    for t, why in zip(targets, reasons(results, served), strict=True):
        t["reason"] = why
        log(f"{t['name']}: {'met' if t['met'] else 'missed'}: {why}")
    report("mcp", results, targets, args.json)
    return 0


def reasons(results: dict[str, Any], served: str) -> list[str]:
    """Why each target is met or missed, from this run's figures (the targets' order)."""
    tc, rs, pn = results["tools_call"][served], results["responses"], results["pins"]
    gw = (f"gateway p50 {tc['gateway_ms']['p50']:.2f} ms = direct {tc['direct_ms']['p50']:.2f} + admission "
          f"{tc['admit_ms']['p50']:.2f} + {tc['overhead_p50_ms']:.2f}; of that overhead the logged decision "
          f"(authorize_tool_call) alone is {tc['authorize_ms']['p50']:.2f} ms, leaving "
          f"{tc['overhead_minus_authorize_p50_ms']:.2f} ms for the MCP framing of the extra hop (the SDK's server "
          f"in fak, its client to the upstream, two thread hand-offs), the key check and the McpToolCalled "
          f"append; the name resolves against the kept listing (no tools/list per call)")
    rt = (f"fak {rs['fak_ms']['p50']:.1f} ms vs client-made {rs['client_made_ms']['p50']:.1f} ms (client's "
          f"tools/list included; {rs['client_made_without_listing_ms']['p50']:.1f} ms without it); fak saves "
          f"the client's second request but also admits the server's definitions through the gate as content "
          f"(mcp:<label>), which a client-made round trip never does")
    pin = (f"{pn['check_ms']['p50']:.3f} ms on a kept listing (digests computed once per McpTool); a fresh "
           f"listing's first check {pn['check_fresh_listing_ms']['p50']:.2f} ms (100 sha256 over RFC 8785); "
           f"listing + check {pn['list_and_check_ms']['p50']:.2f} ms (the tools/list round trip)")
    return [gw, rt, pin]


def _served_json() -> bool:
    """Whether fak's gateway answers with plain JSON (``json_response``) as shipped."""
    from fak.api import mcp_gateway

    return bool(getattr(mcp_gateway, "JSON_RESPONSE", False))


def argparse_suppress() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
