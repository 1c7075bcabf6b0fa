"""Requests with bogus API keys against a real server (issue 25.5): how much the audit log
grows. Each refused request used to append an ``auth_failure`` entry (2,000 requests: 2,000
entries, 4.4 MB); now the first failure of each reason in a window is logged and the rest are
counted into one ``auth_failures`` entry at the window's end or at shutdown (api/authlog.py).

    python bench/auth_flood.py [--requests 10000] [--keys 500] [--json out.json]

The model does not matter here: a tiny random one (tests/support/tiny_kernel.py) keeps startup short.
The target: the log grows by at most 4 entries for the whole flood (one window).
"""

from __future__ import annotations

import resource
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, log, parser, report, target

sys.path.insert(0, str(ROOT / "tests"))
from support.tiny_kernel import make_tiny_model_dir  # noqa: E402 - tests/ is a fixture folder

from fak import Kernel, Settings  # noqa: E402
from fak.api.server import serve  # noqa: E402


def _bogus() -> str:
    return "fak_" + secrets.token_hex(8) + "_" + secrets.token_urlsafe(32)


def main() -> None:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--keys", type=int, default=500, help="distinct bogus keys, used in turn")
    p.add_argument("--threads", type=int, default=4)
    args = p.parse_args()
    keys = [_bogus() for _ in range(args.keys)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        settings = Settings(data_dir=tmp_path / "data", model_path=make_tiny_model_dir(tmp_path / "model"),
                            chunk_size=16)
        kernel = Kernel.open(settings, progress=None)
        try:
            audit = kernel.audit
            with serve(kernel) as live:
                before = audit.size()
                bytes_before = sum(len(e.body) for e in audit.entries(start=0))
                refused = [0] * args.threads

                def flood(t: int) -> None:
                    with live.client(timeout=60) as c:
                        for i in range(t, args.requests, args.threads):
                            key = keys[i % len(keys)]
                            r = c.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"})
                            refused[t] += r.status_code == 401

                t0 = time.perf_counter()
                threads = [threading.Thread(target=flood, args=(t,)) for t in range(args.threads)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = time.perf_counter() - t0
                window = getattr(live.app.state, "auth_failures", None)
                if window is not None:
                    window.flush()  # what the window's end (or shutdown) does
                audit.checkpoint(wait_witnesses=False)  # every append queued before it is committed
                time.sleep(0.5)
                audit.checkpoint(wait_witnesses=False)
                added = list(audit.entries(start=before))
            grown = sum(len(e.body) for e in added)
        finally:
            kernel.close()
    results = {"requests": args.requests, "refused": sum(refused), "distinct_keys": args.keys,
               "entries_added": len(added), "bytes_added": grown, "bytes_before": bytes_before,
               "types": sorted({e.event.type for e in added}), "seconds": round(elapsed, 2),
               "requests_per_s": round(args.requests / elapsed, 1),
               "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    log(f"{args.requests} bogus requests: {len(added)} audit entries added ({grown} bytes) in {elapsed:.1f} s")
    report("auth_flood", results, [target("audit entries added by the flood", len(added), 4, "<=")], args.json)


if __name__ == "__main__":
    main()
