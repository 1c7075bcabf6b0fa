"""Semantic detector benchmark: detection per split, alone and with the phrase detectors, and its cost.

    python bench/semantic.py [--corpus FILE] [--splits dev,heldout] [--json PATH]

Quality on the gate corpus and the real-text corpus (``bench/common.py: load_corpus``; the
blind splits only when named in ``--splits``), per split (in the order they were written):
recall on injected rows (QUARANTINE or DENY) and false-positive rate on benign rows (any
verdict but ALLOW), for

- ``phrases``: examples/policies/default.yaml (the phrase detectors; no semantic rule);
- ``semantic``: a policy with only the semantic rule of strict.yaml (its threshold, its
  normalisation bounds);
- ``phrases+semantic``: either of the two (what default.yaml plus the semantic rule decides:
  the most restrictive verdict wins);
- ``strict``: examples/policies/strict.yaml as shipped (lower injection threshold, shell
  quarantined outright, …).

The head was fit on ``train_semantic.TRAIN_SPLITS`` and its windowing, L2 strength and
threshold chosen on ``train_semantic.SELECT_SPLITS`` (bench/train_semantic.py); the other
splits (fresh5, real-test, fresh6) are read by neither.
Cost: p50/p99 of the semantic-only gate on 1 KiB inputs (dev and heldout rows cut or
repeated to 1 KiB, memo cleared before each call), and ms per KiB on 4, 16 and 64 KiB
inputs (past ``semantic.MAX_BYTES`` of window text the windows are sampled, so the 64 KiB
figure is of partial coverage).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from fak.policy import VerdictKind, gate, load_policy, load_policy_text, semantic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import load_corpus, report, target  # noqa: E402
from gate import _cut, big_input, splits_of  # noqa: E402

BLOCK = {VerdictKind.QUARANTINE, VerdictKind.DENY}
KINDS = ("phrases", "semantic", "phrases+semantic", "strict")


def semantic_only(strict):
    rule = next(r for r in strict.spec.detectors if r.detector == "semantic")
    norm = strict.spec.normalization
    return load_policy_text(
        "apiVersion: fak.dev/v1\nkind: Policy\nmetadata: {name: semantic-only}\nspec:\n"
        f"  defaults: {{max_bytes: {strict.spec.defaults.max_bytes}, media_types: [text/*, application/json]}}\n"
        f"  detectors:\n    - {{id: semantic, detector: semantic, threshold: {rule.threshold}, verdict: QUARANTINE}}\n"
        f"  normalization: {{max_decode_depth: {norm.max_decode_depth}, max_decoded_bytes: {norm.max_decoded_bytes}}}\n",
        "semantic-only.yaml")


def verdicts(policies: dict, rows: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in KINDS}
    t0 = time.perf_counter()
    for n, r in enumerate(rows):
        data = r["text"].encode()
        v = {k: gate(policies[k], r["tool"], data).kind for k in ("phrases", "semantic", "strict")}
        v["phrases+semantic"] = max(v["phrases"], v["semantic"], key=lambda kind: kind.severity)
        for k in KINDS:
            out[k].append(v[k])
        if n % 200 == 199:
            print(f"  {n + 1}/{len(rows)} rows, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def quality(rows: list[dict], found: dict[str, list]) -> dict:
    out: dict = {}
    for split in splits_of(rows):
        idx = [i for i, r in enumerate(rows) if r["split"] == split]
        inj = [i for i in idx if rows[i]["label"] == "injected"]
        ben = [i for i in idx if rows[i]["label"] == "benign"]
        s: dict = {"injected": len(inj), "benign": len(ben)}
        for k in KINDS:
            s[k] = {"recall": round(sum(found[k][i] in BLOCK for i in inj) / len(inj), 4) if inj else None,
                    "fpr": round(sum(found[k][i] is not VerdictKind.ALLOW for i in ben) / len(ben), 4) if ben else None}
        fams = sorted({rows[i]["family"] for i in inj})
        s["semantic_recall_per_family"] = {
            f: round(sum(found["semantic"][i] in BLOCK for i in inj if rows[i]["family"] == f)
                     / sum(rows[i]["family"] == f for i in inj), 4) for f in fams}
        bfams = sorted({rows[i]["family"] for i in ben})
        s["semantic_false_positives_per_family"] = {
            f: f"{sum(found['semantic'][i] is not VerdictKind.ALLOW for i in ben if rows[i]['family'] == f)}"
               f"/{sum(rows[i]['family'] == f for i in ben)}" for f in bfams}
        out[split] = s
    return out


def _timed(policy, tool: str, data: bytes) -> float:
    semantic._MEMO.clear()
    t0 = time.perf_counter()
    gate(policy, tool, data)
    return time.perf_counter() - t0


def latency(policy, rows: list[dict]) -> dict:
    inputs = [(_cut(r["text"], 1024), r["tool"]) for r in rows
              if r["split"] in ("dev", "heldout") and r["label"] == "benign"][::4]
    samples = sorted(_timed(policy, tool, data) * 1000 for data, tool in inputs)
    out = {"n": len(samples), "p50_ms": round(samples[len(samples) // 2], 2),
           "p99_ms": round(samples[int(len(samples) * 0.99)], 2), "mean_ms": round(statistics.fmean(samples), 2)}
    speed_rows = [r for r in rows if r["split"] in ("dev", "heldout")]
    for kib in (4, 16, 64):
        data = big_input(speed_rows, "benign", kib * 1024)
        best = min(_timed(policy, "web_fetch", data) for _ in range(2))
        out[f"ms_per_KiB_{kib}KiB"] = round(best * 1000 / kib, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", nargs="+", help="corpus files (default: the gate corpus and the real-text corpus)")
    ap.add_argument("--splits", help="comma-separated splits to measure (default: all)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    speed_rows = load_corpus(args.corpus, "dev,heldout")
    rows = [r for r in load_corpus(args.corpus, args.splits) if r["label"] in ("injected", "benign")]
    strict = load_policy(ROOT / "examples/policies/strict.yaml")
    policies = {"phrases": load_policy(ROOT / "examples/policies/default.yaml"), "semantic": semantic_only(strict),
                "strict": strict}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    semantic.model()
    load_s = time.perf_counter() - t0
    q = quality(rows, verdicts(policies, rows))
    lat = latency(policies["semantic"], speed_rows)
    load_after = os.getloadavg()
    print(f"{'split':<9} {'inj':>4} {'ben':>4}  " + "  ".join(f"{k:>22}" for k in KINDS))
    for split, s in q.items():
        cells = []
        for k in KINDS:
            rec = "—" if s[k]["recall"] is None else f"{s[k]['recall']:.3f}"
            fpr = "—" if s[k]["fpr"] is None else f"{s[k]['fpr']:.3f}"
            cells.append(f"{'R ' + rec + ' F ' + fpr:>22}")
        print(f"{split:<9} {s['injected']:>4} {s['benign']:>4}  " + "  ".join(cells))
    for split, s in q.items():
        print(f"{split}: semantic per family {s['semantic_recall_per_family']}; "
              f"benign flagged {s['semantic_false_positives_per_family']}")
    print(f"model load {load_s:.2f} s; 1 KiB p50 {lat['p50_ms']} ms p99 {lat['p99_ms']} ms (n={lat['n']}); "
          f"ms/KiB: 4 KiB {lat['ms_per_KiB_4KiB']}, 16 KiB {lat['ms_per_KiB_16KiB']}, 64 KiB {lat['ms_per_KiB_64KiB']} "
          f"(sampled past {semantic.MAX_BYTES} B of window text); torch threads {torch.get_num_threads()}; "
          f"load average {load_before[0]:.2f} / {load_after[0]:.2f}")
    targets = [target(f"{split} semantic recall", s["semantic"]["recall"], 0.95, ">=")
               for split, s in q.items() if s["semantic"]["recall"] is not None and split not in ("dev",)]
    targets += [target(f"{split} semantic FPR", s["semantic"]["fpr"], 0.02, "<=")
                for split, s in q.items() if s["semantic"]["fpr"] is not None]
    report("semantic", {"quality": q, "latency": lat, "model_load_s": round(load_s, 2),
                        "max_bytes": semantic.MAX_BYTES, "loadavg_before": load_before, "loadavg_after": load_after},
           targets, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
