"""Shared helpers for benchmarks: machine facts and the JSON report shape of docs/design.md."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def target(name: str, value: float, goal: float, op: str) -> dict[str, Any]:
    met = value >= goal if op == ">=" else value <= goal
    return {"name": name, "value": value, "target": goal, "op": op, "met": bool(met)}


def skipped(name: str, op: str, reason: str) -> dict[str, Any]:
    """A target whose peer could not be measured: reported with the reason, neither met nor missed."""
    return {"name": name, "value": None, "target": None, "op": op, "met": None, "skipped": reason}


def report(bench: str, results: dict[str, Any], targets: list[dict[str, Any]], json_path: str | None) -> None:
    """Print a human table of the targets and write the JSON object if asked."""
    out = {"bench": bench, "machine": machine(), "results": results, "targets": targets}
    print(f"\n{bench}: targets")
    for t in targets:
        if t.get("skipped"):  # a peer that could not be measured: neither met nor missed
            print(f"  {t['name']:<48} skipped: {t['skipped']}")
            continue
        flag = "met" if t["met"] else "MISSED"
        print(f"  {t['name']:<48} {t['value']:>12.4g} {t['op']} {t['target']:<10g} {flag}")
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", metavar="PATH", help="write the JSON report here")
    return p


def best_of(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Fastest wall time of ``repeat`` runs (and the last result)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


ROOT = Path(__file__).resolve().parent.parent
# The labelled gate corpus and the real-text benign corpus (tests/data/make_*.py); one row schema.
CORPORA = (ROOT / "tests/data/gate_corpus.jsonl", ROOT / "tests/data/real_text.jsonl")


# Splits written blind and not measured yet: left out unless named in ``--splits``. The commit
# that records a split's one measurement takes it off this list (docs/policy.md, Evaluation).
# fresh8: measured once after the signatures change (issue 15): TPR 0.207, FPR 0.005.
BLIND_SPLITS: frozenset[str] = frozenset()


def load_corpus(paths: list[str] | None = None, splits: str | None = None) -> list[dict]:
    """Rows of every corpus file, in file order; ``splits`` (comma-separated) keeps only those
    splits. Without it the blind splits (``BLIND_SPLITS``) are left out, so a blind split is
    not shown before the run meant to measure it."""
    rows = [json.loads(line) for path in (paths or CORPORA)
            for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if splits:
        keep = set(splits.split(","))
        unknown = keep - {r["split"] for r in rows}
        if unknown:
            raise SystemExit(f"no such split: {', '.join(sorted(unknown))}")
        return [r for r in rows if r["split"] in keep]
    hidden = sorted({r["split"] for r in rows} & BLIND_SPLITS)
    if hidden:
        log(f"left out the blind split(s) {', '.join(hidden)}: name them in --splits for their one measurement")
    return [r for r in rows if r["split"] not in BLIND_SPLITS]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
