"""Position-independent reuse (PIC) against exact prefix reuse, on SmolLM2, over the five
shift patterns of ``bench/workloads/agent_traces.py``.

Per pattern, the trace's requests are served in order, each in a fresh session (a
stateless agent call) bound to one tenant's prefix cache and PIC registry, live:

* **Recovery** (every request): prompt tokens served by the exact prefix cache and by
  PIC above it. ``exact_only`` is what exact prefix reuse alone serves (an unbounded
  prefix cache over every earlier request, from call keys: the match ``Session`` uses;
  checked live on the sampled requests). The structural upper bound is the exact prefix
  of either configuration plus the tokens beyond it and beyond position 32 that lie in a
  32-token run or a whole region an earlier request held: content that repeats at a
  shifted position, whatever the chunking.
* **Quality** (sampled requests): the full prefill's greedy continuation (32 tokens) is
  teacher-forced through each setting; per token KL(p_full‖p_x), argmax match and first
  divergence. Settings: exact prefix only, PIC (r = 0), naive reuse (no re-rotation),
  boundary recompute r = 8/16/32, selective recompute of 5 % and 15 % of each chunk.
* **Cost** (sampled requests): time to first token, served live, per setting, beside its
  quality; the sampled settings look up without inserting, so each sees the same state.

    python bench/pic.py [--json PATH] [--requests 80] [--samples 6] [--patterns agent_meta,...]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from common import log, parser, report, target

sys.path.insert(0, str(Path(__file__).resolve().parent / "workloads"))
import agent_traces as workloads  # noqa: E402

from fak.kernel.kv.pic import PicRegistry  # noqa: E402
from fak.kernel.kv.pic_serve import FIRST_CHUNK_POSITIONS, PicBinding  # noqa: E402
from fak.kernel.kv.prefix_cache import PrefixCache, namespace  # noqa: E402
from fak.kernel.kv.prefix_tree import call_keys  # noqa: E402
from fak.kernel.kv.session import PrefixBinding, Session  # noqa: E402
from fak.kernel.model.generate import SamplingParams, generate  # noqa: E402
from fak.kernel.model.loader import load_model  # noqa: E402
from fak.keys import tenant_salt  # noqa: E402

NGRAM = 32
SETTINGS: dict[str, dict] = {
    "exact_prefix": {},
    "pic": {"pic": {}},
    "naive": {"pic": {"naive": True}},
    "pic_r8": {"pic": {"recompute_first": 8}},
    "pic_r16": {"pic": {"recompute_first": 16}},
    "pic_r32": {"pic": {"recompute_first": 32}},
    "pic_blend5": {"pic": {"blend_fraction": 0.05}},
    "pic_blend15": {"pic": {"blend_fraction": 0.15}},
}


@dataclass
class Encoded:
    parts: list[tuple[str, list[int], list[int], dict[str, str]]]  # role, ids, regions, message

    @property
    def ids(self) -> list[int]:
        return [t for _, ids, _, _ in self.parts for t in ids]


def encode(tok, req: workloads.Request) -> Encoded:  # noqa: ANN001
    history: list[dict[str, str]] = []
    parts = []
    for m in req.messages:
        ids, regions = tok.encode_regions(history, m.role, m.pieces)
        message = {"role": m.role, "content": m.text}
        parts.append((m.role, ids, regions, message))
        history.append(message)
    return Encoded(parts)


def serve(model, tok, enc: Encoded, prefix: PrefixBinding | None, pic: PicBinding | None):  # noqa: ANN001, ANN201
    """Prefill the request in a fresh session and compute the first token's logits; returns
    the session, the logits after the generation opener and the time to first token."""
    t0 = time.perf_counter()
    s = Session(model, tok, prefix=prefix, pic=pic)
    for role, ids, regions, message in enc.parts:
        s.append(role, tokens=ids, regions=regions, message=message)
    opener = tok.generation_prompt([m for _, _, _, m in enc.parts])
    logits = model.forward(opener, s.cache)
    int(logits[-1].argmax())
    return s, logits, time.perf_counter() - t0


def teacher_forced(model, s: Session, first_logits: torch.Tensor, cont: list[int]) -> torch.Tensor:  # noqa: ANN001
    """Log-probabilities at each continuation token, the cache forced along ``cont``."""
    rest = model.forward(cont[:-1], s.cache, all_logits=True) if len(cont) > 1 else first_logits[:0]
    return torch.log_softmax(torch.cat([first_logits[-1:], rest]).float(), dim=-1)


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    kl = (ref.exp() * (ref - got)).sum(-1)
    same = ref.argmax(-1) == got.argmax(-1)
    first = int((~same).nonzero()[0]) if not bool(same.all()) else len(same)
    return {"kl": float(kl.mean()), "argmax_match": float(same.float().mean()), "first_divergence": first}


def exact_only(keys: list[list[int]], plans: list[list[int]], i: int) -> int:
    """Tokens an exact prefix cache holding every earlier request serves to request ``i``:
    the longest call-key prefix shared with one of them, down to a call boundary of ``i``."""
    best = 0
    for j in range(i):
        a, b = keys[i], keys[j]
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        best = max(best, n)
    served = 0
    for end in plans[i]:
        if end <= best:
            served = end
    return served


def region_spans(enc: Encoded) -> list[tuple[int, int]]:
    """Absolute ``[start, end)`` of every region the assembler declared (a piece runs to the
    next piece, the last one to its message's end)."""
    spans, pos = [], 0
    for _, ids, regions, _ in enc.parts:
        cuts = [*regions, len(ids)]
        spans += [(pos + a, pos + b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
        pos += len(ids)
    return spans


def structural(enc: Encoded, seen: set[tuple[int, ...]], seen_regions: set[tuple[int, ...]], exact: int) -> int:
    """Tokens at positions ≥ 32 and ≥ ``exact`` inside a 32-token run or a whole region
    that an earlier request held: content that repeats, wherever it landed."""
    ids = enc.ids
    covered = bytearray(len(ids))
    for i in range(len(ids) - NGRAM + 1):
        if tuple(ids[i : i + NGRAM]) in seen:
            covered[i : i + NGRAM] = b"\x01" * NGRAM
    for a, b in region_spans(enc):
        if tuple(ids[a:b]) in seen_regions:
            covered[a:b] = b"\x01" * (b - a)
    lo = max(FIRST_CHUNK_POSITIONS, exact)
    return sum(covered[lo:])


def run_pattern(lm, pattern: str, n: int, samples: int, new_tokens: int, tenant_ns: bytes,  # noqa: ANN001
                partial: str | None = None) -> dict:
    model, tok = lm.model, lm.tokenizer
    reqs = workloads.trace(pattern, n)
    encoded = [encode(tok, r) for r in reqs]
    registry = PicRegistry(model.model_id, tok.digest, budget_bytes=4 << 30)
    prefix = PrefixCache(budget_bytes=4 << 30)
    plans_exact: list[list[int]] = []
    keys_exact: list[list[int]] = []
    for enc in encoded:  # the calls a PIC-off session makes: each message in chunks of 512
        starts, ends, pos = [], [], 0
        for _, ids, _, _ in enc.parts:
            for k in range(0, len(ids), 512):
                starts.append(pos + k)
                ends.append(pos + min(len(ids), k + 512))
            pos += len(ids)
        keys_exact.append(call_keys(enc.ids, starts))
        plans_exact.append(ends)
    picked = sorted({n // 2 + round(k * (n - 1 - n // 2) / max(1, samples - 1)) for k in range(samples)})
    rows, quality, ttft = [], {k: [] for k in SETTINGS}, {k: [] for k in SETTINGS}
    checks: list[bool] = []
    seen: set[tuple[int, ...]] = set()
    seen_regions: set[tuple[int, ...]] = set()
    for i, enc in enumerate(encoded):
        ids = enc.ids
        exact_off = exact_only(keys_exact, plans_exact, i)
        if i in picked:
            quality_for(lm, enc, prefix, registry, tenant_ns, new_tokens, quality, ttft,
                        exact_off, checks)
        s, _, t = serve(model, tok, enc, PrefixBinding(prefix, tenant_ns), PicBinding(registry, tenant_ns))
        # the exact prefix of either configuration (PIC's smaller calls can match whole chunks
        # that 512-token calls cannot), then what repeats beyond it
        exact = max(exact_off, s.prefix_hit_tokens)
        ub = exact - exact_off + structural(enc, seen, seen_regions, exact)
        rows.append({"tokens": len(ids), "exact_only": exact_off, "exact_on": s.prefix_hit_tokens,
                     "pic_on": s.pic_hit_tokens, "structural_above_exact": ub, "ttft_on_s": t})
        for k in range(len(ids) - NGRAM + 1):
            seen.add(tuple(ids[k : k + NGRAM]))
        seen_regions.update(tuple(ids[a:b]) for a, b in region_spans(enc))
        if (i + 1) % 10 == 0:
            log(f"  {pattern}: {i + 1}/{n} requests, registry {registry.nbytes / 2**20:.0f} MiB")
            if partial:  # a long run leaves what it has measured so far
                Path(partial).write_text(json.dumps({"pattern": pattern, "rows": rows, "quality": quality,
                                                     "ttft": ttft, "sampled": picked, "checks": checks}))
    total = sum(r["tokens"] for r in rows)
    exact_off = sum(r["exact_only"] for r in rows)
    served_on = sum(r["exact_on"] + r["pic_on"] for r in rows)
    pic_above = served_on - exact_off
    ub_above = sum(r["structural_above_exact"] for r in rows)
    out = {
        "requests": n,
        "prompt_tokens": total,
        "exact_only_fraction": exact_off / total,
        "exact_with_pic_fraction": sum(r["exact_on"] for r in rows) / total,
        "pic_fraction": sum(r["pic_on"] for r in rows) / total,
        "pic_above_exact_fraction": pic_above / total,
        "total_fraction": served_on / total,
        "structural_upper_bound_fraction": (exact_off + ub_above) / total,
        "pic_of_upper_bound": pic_above / ub_above if ub_above else 1.0,
        "ttft_on_mean_s": statistics.fmean(r["ttft_on_s"] for r in rows),
        "quality": {k: _mean(v) for k, v in quality.items() if v},
        "ttft_sampled_s": {k: statistics.fmean(v) for k, v in ttft.items() if v},
        "sampled_requests": picked,
        "exact_only_checked_live": f"{sum(checks)}/{len(checks)}",
    }
    log(f"  {pattern}: exact-only {out['exact_only_fraction']:.3f}, PIC above exact "
        f"{out['pic_above_exact_fraction']:.3f}, of upper bound {out['pic_of_upper_bound']:.3f}")
    return out


def quality_for(lm, enc: Encoded, prefix: PrefixCache, registry: PicRegistry, ns: bytes, new_tokens: int,
                quality: dict, ttft: dict, exact_off: int, checks: list[bool]) -> None:
    model, tok = lm.model, lm.tokenizer
    ref_s, ref_logits, _ = serve(model, tok, enc, None, None)
    forced = ref_s.cache.clone()
    eos = frozenset(tok.stop_token_ids)
    cont = list(generate(model, ref_s.cache, None, SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens,
                                                                  stop_token_ids=eos), logits=ref_logits))
    ref_s.cache = forced
    ref = teacher_forced(model, ref_s, ref_logits, cont)
    # exact prefix only: a prefix cache holding the rows an earlier request shares with this one
    # (the same tokens and calls give the same bytes, so they are computed from this request)
    exact_cache = PrefixCache(budget_bytes=4 << 30)
    seed = Session(model, tok, prefix=PrefixBinding(exact_cache, ns))
    left = exact_off
    for role, ids, _, message in enc.parts:
        if left <= 0:
            break
        take = min(left, len(ids))
        seed.append(role, tokens=ids[:take], chunks=[min(512, take - k) for k in range(0, take, 512)],
                    message=message)
        left -= take
    for name, cfg in SETTINGS.items():
        times = []
        for _ in range(2):  # best of two: the machine is shared, and each run sees the same state
            if "pic" in cfg:
                s, logits, t = serve(model, tok, enc, PrefixBinding(prefix, ns, insert=False),
                                     PicBinding(registry, ns, insert=False, **cfg["pic"]))
            else:
                s, logits, t = serve(model, tok, enc, PrefixBinding(exact_cache, ns, insert=False), None)
            times.append(t)
        t = min(times)
        if "pic" not in cfg:
            checks.append(s.prefix_hit_tokens == exact_off)  # the computed exact-only figure, live
        got = teacher_forced(model, s, logits, cont)
        quality[name].append(compare(ref, got) | {"served": s.prefix_hit_tokens + s.pic_hit_tokens})
        ttft[name].append(t)


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(r[k] for r in rows) for k in rows[0]} | {
        "first_divergence_min": min(r["first_divergence"] for r in rows)}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--patterns", default=",".join(workloads.PATTERNS))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    log("loading model ...")
    lm = load_model()
    ns = namespace(tenant_salt(bytes(32), "bench"), lm.model.model_id)
    results: dict[str, dict] = {}
    targets = []
    for pattern in args.patterns.split(","):
        log(f"{pattern}: {args.requests} requests")
        r = results[pattern] = run_pattern(lm, pattern, args.requests, args.samples, args.new_tokens, ns,
                                           f"{args.json}.{pattern}.partial" if args.json else None)
        targets.append(target(f"{pattern}: PIC above exact, of the structural bound", r["pic_of_upper_bound"],
                              0.90, ">="))
        q = r["quality"]
        if "pic" in q and "naive" in q:
            targets.append(target(f"{pattern}: KL naive - KL PIC", q["naive"]["kl"] - q["pic"]["kl"], 0.0, ">="))
            best = max((k for k in q if k.startswith("pic")), key=lambda k: q[k]["argmax_match"])
            targets.append(target(f"{pattern}: argmax match, best PIC ({best})", q[best]["argmax_match"], 0.90, ">="))
        tt = r["ttft_sampled_s"]
        if "pic" in tt and "exact_prefix" in tt:
            targets.append(target(f"{pattern}: TTFT exact / TTFT PIC", tt["exact_prefix"] / tt["pic"], 1.0, ">="))
    if "agent_meta" in results:
        targets.insert(0, target("agent_meta: PIC-served, of prompt tokens",
                                 results["agent_meta"]["pic_fraction"], 0.77, ">="))
    report("pic", {"patterns": results, "settings": SETTINGS, "ngram": NGRAM}, targets, args.json)
    if not all(math.isfinite(t["value"]) for t in targets):
        raise SystemExit("non-finite figure")


if __name__ == "__main__":
    main()
