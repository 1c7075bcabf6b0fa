"""Train the semantic detector's head (``policy/data/semantic_head.npz``).

    python bench/train_semantic.py            # writes the head, prints the selection
    python bench/train_semantic.py --check    # rebuilds it and compares with the committed file

Splits (``tests/data/gate_corpus.jsonl`` and the real-text corpus ``tests/data/real_text.jsonl``):

- fit on ``TRAIN_SPLITS``: dev, the spent blind splits fresh, fresh2 and fresh3 (each was
  measured once before this head existed), and real-train (documentation nobody here wrote);
- choose the windowing, L2 strength and threshold on ``SELECT_SPLITS``: heldout, fresh4 (140
  benign hard negatives, measured once against the previous head) and real-select;
- never read fresh5 or real-test: they measure the head once, afterwards (bench/semantic.py).

Every injected row is windowed the way the detector windows input (``semantic.windows`` over
the views of the whole text, with the strict policy's decoding bounds). The generator knows
each row's payload (``PAYLOADS[split][family][payload]``): a window is a positive when at
least half of its word trigrams are trigrams of that payload (folded). The other windows of
injected rows (carrier text, obfuscation leads such as "decode this base64 …") are left out:
they are neither clearly payload nor clearly benign. Every window of benign and
secret-bearing rows is a negative. Windows are deduplicated by text.

Model: L2-regularised logistic regression on the 384-d embedding, classes weighted to equal
total weight, fitted by Newton's method in float64 to convergence (deterministic: no random
initialisation, no sampling; the seed recorded in the file is not used by the fit).

Selection: for each windowing (``min_letters``: a short line or sentence is joined with the
next ones until the window has that many letters) and L2 strength, the threshold is the
lowest of a grid at which at most 2 % of the benign rows of *each* selection split have a
window at or above it (the policy's false-positive target, held on hard negatives and on
real documentation alike), and the configuration with the highest recall on the selection
splits' injected rows there wins (ties: the higher threshold, then the stronger L2).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from fak.policy import semantic
from fak.policy.normalize import fold
from fak.policy.scan import prepare

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import load_corpus  # noqa: E402

TRAIN_SPLITS = ("dev", "fresh", "fresh2", "fresh3", "real-train")
SELECT_SPLITS = ("heldout", "fresh4", "real-select")
SEED = 20240514
L2_GRID = (1e-5, 1e-4, 1e-3)
MIN_LETTERS = (8, 24, 40)
# 0.05 … 0.99, then finer up to 0.9999: on hard negatives the head's scores crowd near 1
THRESHOLDS = tuple(round(0.05 + 0.01 * i, 2) for i in range(95)) + tuple(round(0.991 + 0.001 * i, 3) for i in range(9)) \
    + tuple(round(0.9991 + 0.0001 * i, 4) for i in range(9))
FPR_TARGET = 0.02
MAX_DEPTH, MAX_DECODED = 3, 131072  # examples/policies/strict.yaml's normalization
_WORD = re.compile(r"[a-z0-9]+")


def _generator():
    spec = importlib.util.spec_from_file_location("make_gate_corpus", ROOT / "tests/data/make_gate_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def trigrams(text: str) -> set[tuple[str, ...]]:
    w = _WORD.findall(text)
    return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}


def row_windows(row: dict, chunk: int) -> list[str]:
    scan = prepare(row["text"].encode(), MAX_DEPTH, MAX_DECODED)
    return [w.text for w in semantic.windows(scan, chunk)]


def dataset(rows: list[dict], chunk: int, payloads: dict) -> tuple[list[str], np.ndarray]:
    pos: dict[str, None] = {}
    neg: dict[str, None] = {}
    for row in rows:
        if row["split"] not in TRAIN_SPLITS:
            continue
        if row["label"] == "injected":
            grams = trigrams(fold(payloads[row["split"]][row["family"]][row["payload"]]))
            for text in row_windows(row, chunk):
                mine = trigrams(text)
                if mine and len(mine & grams) >= 0.5 * len(mine):
                    pos[text] = None
        else:
            for text in row_windows(row, chunk):
                neg[text] = None
    both = set(pos) & set(neg)
    texts = [t for t in pos if t not in both] + [t for t in neg if t not in both]
    labels = np.array([1.0] * (len(pos) - len(both)) + [0.0] * (len(neg) - len(both)))
    return texts, labels


def fit(x: np.ndarray, y: np.ndarray, l2: float, iters: int = 100) -> tuple[np.ndarray, float]:
    """Weighted L2 logistic regression (intercept not penalised) by Newton's method."""
    n, d = x.shape
    xb = np.hstack([x.astype(np.float64), np.ones((n, 1))])
    sw = np.where(y == 1, 0.5 / y.sum(), 0.5 / (n - y.sum()))  # each class weighs one half
    w = np.zeros(d + 1)
    reg = np.full(d + 1, l2)
    reg[-1] = 0.0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        grad = xb.T @ (sw * (p - y)) + reg * w
        hess = (xb * (sw * p * (1 - p))[:, None]).T @ xb + np.diag(reg) + 1e-12 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-12:
            break
    return w[:d], float(w[d])


def item_scores(rows: list[dict], chunk: int, cache: dict[str, np.ndarray], coef: np.ndarray, b: float) -> list[float]:
    out = []
    for row in rows:
        texts = row_windows(row, chunk)
        if not texts:
            out.append(0.0)
            continue
        z = np.stack([cache[t] for t in texts]).astype(np.float64) @ coef + b
        out.append(float((1.0 / (1.0 + np.exp(-z))).max()))
    return out


def embed_all(texts: list[str], cache: dict[str, np.ndarray]) -> None:
    enc = semantic.encoder()
    todo = [t for t in dict.fromkeys(texts) if t not in cache]
    if todo:
        t0 = time.perf_counter()
        for t, e in zip(todo, enc.embed(todo), strict=True):
            cache[t] = e
        print(f"  embedded {len(todo)} windows in {time.perf_counter() - t0:.1f} s", file=sys.stderr)


def train(rows: list[dict]) -> dict:
    payloads = _generator().PAYLOADS
    select = [r for r in rows if r["split"] in SELECT_SPLITS and r["label"] in ("injected", "benign")]
    cache: dict[str, np.ndarray] = {}
    trials = []
    best = None
    for chunk in MIN_LETTERS:
        texts, y = dataset(rows, chunk, payloads)
        embed_all(texts + [t for r in select for t in row_windows(r, chunk)], cache)
        x = np.stack([cache[t] for t in texts])
        for l2 in L2_GRID:
            coef, b = fit(x, y, l2)
            scores = item_scores(select, chunk, cache, coef, b)
            inj = [s for s, r in zip(scores, select, strict=True) if r["label"] == "injected"]
            benign = {split: [s for s, r in zip(scores, select, strict=True) if r["label"] == "benign" and r["split"] == split]
                      for split in SELECT_SPLITS}
            ok = [t for t in THRESHOLDS
                  if all(sum(s >= t for s in ben) <= FPR_TARGET * len(ben) for ben in benign.values())]
            thr = ok[0] if ok else 1.0
            recall = sum(s >= thr for s in inj) / len(inj)
            trial = {"min_letters": chunk, "l2": l2, "threshold": thr, "select_recall": round(recall, 4),
                     **{f"fpr_{split}": round(sum(s >= thr for s in ben) / len(ben), 4) for split, ben in benign.items()},
                     "positives": int(y.sum()), "negatives": int(len(y) - y.sum())}
            print(f"  {trial}", file=sys.stderr)
            trials.append(trial)
            rank = (recall, thr, l2)
            if best is None or rank > best[0]:
                best = (rank, trial, coef, b)
    _, trial, coef, b = best
    return {"coef": coef, "intercept": np.float64(b), "min_letters": np.int64(trial["min_letters"]),
            "threshold": np.float64(trial["threshold"]), "l2": np.float64(trial["l2"]), "seed": np.int64(SEED),
            "train_sha256": np.str_(_train_digest(rows)), "train_splits": np.str_(",".join(TRAIN_SPLITS)),
            "select_splits": np.str_(",".join(SELECT_SPLITS)), "trials": np.str_(json.dumps(trials))}


def _train_digest(rows: list[dict]) -> str:
    """SHA-256 over the training rows (canonical JSON), so a head names the data it was fit on."""
    h = hashlib.sha256()
    for r in rows:
        if r["split"] in TRAIN_SPLITS:
            h.update(json.dumps(r, sort_keys=True).encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed head instead of writing it")
    ap.add_argument("--out", default=str(semantic.HEAD_PATH))
    args = ap.parse_args()
    rows = load_corpus(splits=",".join(TRAIN_SPLITS + SELECT_SPLITS))
    head = train(rows)
    chosen = {k: head[k].item() for k in ("min_letters", "l2", "threshold")}
    print(f"chosen on {', '.join(SELECT_SPLITS)}: {chosen}")
    if args.check:
        with np.load(args.out) as z:
            old = {k: z[k] for k in z.files}
        diff = float(np.abs(old["coef"] - head["coef"]).max())
        same = all(str(old[k]) == str(head[k]) for k in ("min_letters", "threshold", "l2", "train_sha256"))
        print(f"max |Δcoef| = {diff:.3g}, |Δintercept| = {abs(float(old['intercept']) - float(head['intercept'])):.3g}, "
              f"settings equal: {same}")
        return 0 if same and diff <= 1e-6 else 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, **head)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
