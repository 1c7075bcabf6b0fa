"""Timing probe across tenants: can tenant B tell, from how fast its request is answered,
whether tenant A sent the same prompt before (a prefix-cache hit leaking as latency)?

A real server (``fak.api.server.serve``, uvicorn on loopback) around a Kernel with the
real model. For each of ``--samples`` rounds, with a fresh random prompt P and another
Q of the same word count:

- A sends P as the system message of a new session (A's namespace now holds P);
- ``a_hit``: A sends P again in another new session (a hit: the positive control);
- ``b_cross``: B sends P in a new session (a hit only if the cache leaked across tenants);
- ``b_miss``: B sends Q, which nobody sent before (a miss: the baseline).

With ``--pic`` the probe is the PIC registry's instead (a policy allowing approximate
reuse): every session starts with its own untimed system header (a fresh nonce), and the
timed request is P or Q as the user message after it, so P sits at a shifted position and
only a PIC chunk (never an exact prefix) could serve it.

The three measured requests run in a random order each round. Reported: medians and
percentiles, the Mann-Whitney U test (two-sided, normal approximation with tie
correction) and a permutation test on the difference of medians, for b_cross vs b_miss
(should not differ) and a_hit vs b_miss (must differ, or the probe could not see a hit).

    python bench/isolation.py --json bench/out/isolation.json [--samples 40 --words 160] [--pic]
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from common import log, parser, report, target

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
         "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble", "quartz", "raven", "saffron", "thistle",
         "umber", "violet", "willow", "xenon", "yarrow", "zephyr", "anchor", "bramble", "cobalt", "dune",
         "estuary", "falcon", "glacier", "heather", "island", "jasper", "kelp", "lantern", "marble", "nimbus"]


def mann_whitney(x: list[float], y: list[float]) -> dict[str, float]:
    """Two-sided Mann-Whitney U with the normal approximation and tie correction."""
    n1, n2 = len(x), len(y)
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled, strict=True) if g == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = (u1 - mu - math.copysign(0.5, u1 - mu)) / sigma if sigma > 0 and u1 != mu else 0.0
    p = math.erfc(abs(z) / math.sqrt(2))
    return {"u": u1, "z": z, "p": p, "effect_auc": u1 / (n1 * n2)}


def permutation(x: list[float], y: list[float], rounds: int = 20000, seed: int = 7) -> float:
    """Two-sided permutation p-value of |median(x) - median(y)|."""
    rng = random.Random(seed)
    observed = abs(statistics.median(x) - statistics.median(y))
    pooled, n1, hits = x + y, len(x), 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        if abs(statistics.median(pooled[:n1]) - statistics.median(pooled[n1:])) >= observed - 1e-12:
            hits += 1
    return (hits + 1) / (rounds + 1)


def summary(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {"n": len(s), "median_ms": 1000 * statistics.median(s), "p10_ms": 1000 * s[len(s) // 10],
            "p90_ms": 1000 * s[(9 * len(s)) // 10], "mean_ms": 1000 * statistics.fmean(s)}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--words", type=int, default=160, help="words of each probe prompt (~1.5 tokens each)")
    p.add_argument("--model", default=None, help="model path (default: the SmolLM2 wheel)")
    p.add_argument("--seed", type=int, default=19)
    p.add_argument("--pic", action="store_true", help="probe the PIC registry (shifted positions) instead of the prefix cache")
    args = p.parse_args()
    if not 5 <= args.samples <= 500 or not 8 <= args.words <= 1000:
        raise SystemExit("--samples in [5, 500], --words in [8, 1000]")

    from fak import Kernel, Settings
    from fak.api.server import serve
    from fak.kernel.facade import default_policy_path

    metric = "fak_pic_hit_tokens_total " if args.pic else "fak_prefix_cache_hit_tokens_total "

    rng = random.Random(args.seed)

    def prompt() -> str:
        # a nonce first: no two prompts share a prefix beyond the chat template's header, so
        # any extra hit on A's prompt in B's request could only come from A's namespace
        return f"{rng.getrandbits(64):x} " + " ".join(rng.choice(WORDS) for _ in range(args.words))

    samples: dict[str, list[float]] = {"a_hit": [], "b_cross": [], "b_miss": []}
    with tempfile.TemporaryDirectory(prefix="fak-isolation-") as tmp:
        extra: dict[str, object] = {"model_path": args.model} if args.model else {}
        if args.pic:
            policy = Path(tmp) / "policy.yaml"
            policy.write_text(default_policy_path().read_text().replace("pic_approximate: false", "pic_approximate: true"))
            extra["policy_path"] = policy
        settings = Settings(data_dir=Path(tmp) / "data", **extra)
        with Kernel.open(settings, progress=log) as k, serve(k) as live:
            keys = {t: live.key(t, "agent") for t in ("tenant-a", "tenant-b")}
            admin = {t: live.key(t, "admin") for t in ("tenant-a", "tenant-b")}
            clients = {t: live.client(key, timeout=600) for t, key in keys.items()}

            def post(c, sid: str, role: str, text: str) -> None:  # noqa: ANN001
                r = c.post(f"/v1/sessions/{sid}/messages", json={"role": role, "content": text})
                if r.status_code != 201:
                    raise SystemExit(f"{r.status_code} {r.text[:300]}")

            def timed_system(tenant: str, text: str) -> float:
                """Seconds of the request carrying ``text``: the system message of a new session,
                or (``--pic``) the user message after a fresh header of its own."""
                c = clients[tenant]
                sid = c.post("/v1/sessions", json={}).json()["id"]
                if args.pic:
                    post(c, sid, "system", f"Request {rng.getrandbits(64):x}. You are a careful assistant.")
                t0 = time.perf_counter()
                post(c, sid, "user" if args.pic else "system", text)
                return time.perf_counter() - t0

            def hits(tenant: str) -> float:
                with live.client(admin[tenant]) as c:
                    for line in c.get("/metrics").text.splitlines():
                        if line.startswith(metric):
                            return float(line.split()[1])
                return 0.0

            timed_system("tenant-a", prompt())  # warm-up: first-request costs out of the samples
            timed_system("tenant-b", prompt())
            hit_tokens: dict[str, list[float]] = {name: [] for name in samples}
            t_start = time.perf_counter()
            for i in range(args.samples):
                P, Q = prompt(), prompt()
                timed_system("tenant-a", P)
                order = ["a_hit", "b_cross", "b_miss"]
                rng.shuffle(order)
                for name in order:
                    tenant, text = {"a_hit": ("tenant-a", P), "b_cross": ("tenant-b", P),
                                    "b_miss": ("tenant-b", Q)}[name]
                    before = hits(tenant)
                    samples[name].append(timed_system(tenant, text))
                    hit_tokens[name].append(hits(tenant) - before)
                if i % 10 == 9:
                    log(f"  {i + 1}/{args.samples} rounds, {time.perf_counter() - t_start:.0f} s")
            # B's own earlier prompts share a few leading tokens with a new one (the chat template's
            # header, a nonce's first characters): 0-4 hit tokens in B's own namespace on any prompt. A
            # leak of A's prompt would serve B the whole prompt (as A's second session is: ~250 tokens),
            # so the test is that B's hits on A's prompts stay within those on fresh prompts
            b_cross_hits = max(hit_tokens["b_cross"]) - max(hit_tokens["b_miss"])
            for c in clients.values():
                c.close()

    cross = mann_whitney(samples["b_cross"], samples["b_miss"])
    control = mann_whitney(samples["a_hit"], samples["b_miss"])
    results = {
        "samples": args.samples, "words": args.words, "probe": "pic" if args.pic else "prefix",
        "latency": {name: summary(v) for name, v in samples.items()},
        "b_cross_vs_b_miss": cross | {"permutation_p_median": permutation(samples["b_cross"], samples["b_miss"])},
        "a_hit_vs_b_miss": control | {"permutation_p_median": permutation(samples["a_hit"], samples["b_miss"])},
        "hit_tokens_per_request": {name: {"min": min(v), "max": max(v)} for name, v in hit_tokens.items()},
        "b_cross_extra_hit_tokens_max": b_cross_hits,
        "raw_s": samples,
    }
    for name, s in results["latency"].items():
        print(f"  {name:<8} median {s['median_ms']:8.1f} ms  p10 {s['p10_ms']:8.1f}  p90 {s['p90_ms']:8.1f}")
    print(f"  b_cross vs b_miss: Mann-Whitney p = {cross['p']:.3f} (AUC {cross['effect_auc']:.2f}); "
          f"permutation p = {results['b_cross_vs_b_miss']['permutation_p_median']:.3f}")
    print(f"  a_hit  vs b_miss: Mann-Whitney p = {control['p']:.2e} (AUC {control['effect_auc']:.2f})")
    targets = [
        target("B's max hit tokens on A's prompts - on fresh ones", b_cross_hits, 0, "<="),
        target("B cross vs B miss: Mann-Whitney p (no difference)", cross["p"], 0.01, ">="),
        target("A hit vs B miss: Mann-Whitney p (probe sees a hit)", control["p"], 0.001, "<="),
    ]
    report("isolation", results, targets, args.json)


if __name__ == "__main__":
    main()
