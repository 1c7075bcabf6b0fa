"""Console page times (issue 31): a session with 1,000 segments and a tenant with 10,000
audit entries, each page fetched over HTTP from a real server on localhost.

    python bench/console.py [--segments 1000] [--entries 10000] [--repeat 20] [--json out.json]

The model does not matter here: a tiny random one (tests/support/tiny_kernel.py) keeps startup short.
Three of every four segments are evicted right after they are appended (they stay in the
ledger, as evicted, and keep the context short enough for the tiny model), so the ledger holds
``--segments`` rows. The audit log is filled with ``policy_loaded`` entries of the tenant up
to ``--entries``. Times are the client's (request sent to last byte on 127.0.0.1), an upper
bound on the server's render time. Target: p50 <= 300 ms for the session page and the audit page.

Tiles: every hash tile and entry bundle of the log (``/v1/audit/log/tile/...``, the C2SP
tlog-tiles an auditor's client fetches) is read once to warm the caches, then read again
``--tile-rounds`` times, one client and four clients at once; figure: tiles served per second.
"""

from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from common import ROOT, log, parser, report, target

sys.path.insert(0, str(ROOT / "tests"))
from support.tiny_kernel import make_tiny_model_dir  # noqa: E402 - tests/ is a fixture folder

from fak import Kernel, Settings  # noqa: E402
from fak.api.server import serve  # noqa: E402
from fak.audit import PolicyLoaded  # noqa: E402
from fak.audit.tiles import bundles_for_size, tiles_for_size  # noqa: E402

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def sign_in(url: str, key: str) -> httpx.Client:
    """A console session on the loopback server. The console's cookies are Secure (``__Host-``),
    which a browser sends over http to 127.0.0.1 and Python's cookie jar only over https: kept
    cookies are marked sendable, as the browser treats them."""
    b = httpx.Client(base_url=url, trust_env=False, timeout=120)

    def loopback_is_secure(_response: httpx.Response) -> None:
        for kept in b.cookies.jar:
            kept.secure = False

    b.event_hooks["response"].append(loopback_is_secure)
    token = CSRF.search(b.get("/console/login").text)
    assert token is not None
    r = b.post("/console/login", data={"key": key, "csrf": token.group(1)})
    assert r.status_code == 303, r.text[:300]
    return b


def times(b: httpx.Client, path: str, repeat: int) -> dict[str, float]:
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = b.get(path)
        ms.append(1000 * (time.perf_counter() - t0))
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    ms.sort()
    return {"p50_ms": round(statistics.median(ms), 1), "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 1),
            "bytes": len(r.content)}


def tiles_per_second(url: str, key: str, paths: list[str], rounds: int, clients: int) -> float:
    """Tiles served per second to ``clients`` clients reading ``paths`` ``rounds`` times."""
    def read(share: list[str]) -> int:
        with httpx.Client(base_url=url, trust_env=False, timeout=120,
                          headers={"Authorization": f"Bearer {key}"}) as c:
            for path in share:
                r = c.get(path)
                assert r.status_code == 200, (path, r.status_code, r.text[:200])
        return len(share)

    work = paths * rounds
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        served = sum(pool.map(read, [work[i::clients] for i in range(clients)]))
    return round(served / (time.perf_counter() - t0), 1)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--segments", type=int, default=1000)
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--tile-rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        settings = Settings(data_dir=tmp_path / "data", model_path=make_tiny_model_dir(tmp_path / "model"),
                            chunk_size=16, operator_tenant="ops")  # ops' auditors read entry bundles
        kernel = Kernel.open(settings, progress=None)
        try:
            with serve(kernel) as live:
                agent = live.client(live.key("acme", "agent"), timeout=120)
                sid = agent.post("/v1/sessions", json={}).json()["id"]
                t0 = time.perf_counter()
                for i in range(args.segments):
                    seg = agent.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": f"m{i}"})
                    assert seg.status_code == 201, seg.text[:300]
                    if i % 4:
                        r = agent.post(f"/v1/sessions/{sid}/evict", json={"segment_id": seg.json()["id"]})
                        assert r.status_code == 200, r.text[:300]
                log(f"{args.segments} segments in {time.perf_counter() - t0:.1f} s")
                t0 = time.perf_counter()
                have = sum(1 for _ in kernel.audit.entries("acme", 0, None))
                for i in range(max(0, args.entries - have)):
                    kernel.audit.append(PolicyLoaded(policy_id=f"p{i}", policy_digest="sha256:" + "0" * 64,
                                                     tenant="acme"))
                log(f"audit entries filled to {args.entries} in {time.perf_counter() - t0:.1f} s")
                b = sign_in(live.url, live.key("acme", "auditor"))
                pages = {"session": f"/console/sessions/{sid}", "sessions": "/console/sessions",
                         "audit": "/console/audit", "audit_filtered": "/console/audit?type=eviction",
                         "audit_entry": f"/console/audit/entries/{kernel.audit.size() - 1}",
                         "tool_calls": "/console/tool-calls", "metrics": "/console/metrics"}
                results: dict[str, object] = {"segments": args.segments, "audit_entries": args.entries,
                                              "repeat": args.repeat}
                for name, path in pages.items():
                    results[name] = times(b, path, args.repeat)
                    log(f"{name}: {results[name]}")
                b.close()
                agent.close()
                operator = live.key("ops", "auditor")
                size = kernel.audit.size()
                with httpx.Client(base_url=live.url, trust_env=False, timeout=120,
                                  headers={"Authorization": f"Bearer {operator}"}) as c:
                    size = int(c.get("/v1/audit/log/checkpoint").text.splitlines()[1])  # signs one covering all
                paths = [f"/v1/audit/log/{t.path()}" for t in tiles_for_size(size) + bundles_for_size(size)]
                tiles_per_second(live.url, operator, paths, 1, 1)  # warm
                results["tiles"] = {"tree_size": size, "tiles": len(paths), "rounds": args.tile_rounds,
                                    "per_s_1_client": tiles_per_second(live.url, operator, paths, args.tile_rounds, 1),
                                    "per_s_4_clients": tiles_per_second(live.url, operator, paths,
                                                                        args.tile_rounds, 4)}
                log(f"tiles: {results['tiles']}")
        finally:
            kernel.close()
    session, audit = results["session"], results["audit"]
    assert isinstance(session, dict) and isinstance(audit, dict)
    report("console", results, [
        target(f"session page p50, {args.segments} segments (ms)", session["p50_ms"], 300, "<="),
        target(f"audit page p50, {args.entries} entries (ms)", audit["p50_ms"], 300, "<="),
    ], args.json)


if __name__ == "__main__":
    main()
