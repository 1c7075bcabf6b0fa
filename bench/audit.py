"""Audit log benchmark: durable group-committed appends on SQLite with the remembering
signer (tree recomputed from entries before each signature, state file fsynced) and one
loopback witness (a ``fak witness serve`` process, C2SP tlog-witness over HTTP) cosigning
every checkpoint; cosigning latency; inclusion-proof latency at 1M entries; the signer's
check on reopening 1M entries; offline verify throughput.

Peers in the same run: the same log without a witness, with one blocking appender (each
append its own transaction and fsync: no group commit) and with many blocking threads.
Usage: python bench/audit.py [--json PATH] [--proof-size N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fak.audit import AuditLog, PolicyLoaded, WitnessEndpoint, merkle, verify_export
from fak.audit.cosignature import cosignatures

P = "sha256:" + "cd" * 32
# the bound on coverage lag: a checkpoint signed while a request is in flight waits for that
# round trip and its own (proof, HTTP, the witness's fsyncs), then the writer's store
COVER_BOUND_MS = 1000


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def events(n: int, offset: int = 0) -> list[PolicyLoaded]:
    return [PolicyLoaded(policy_id=f"p{offset + i}", policy_digest=P, tenant=f"t{i % 7}") for i in range(n)]


def _rate(evs: list, threads_n: int, run_share: Callable[[list], None]) -> float:
    """Events per second with ``threads_n`` threads, each running ``run_share`` on its equal share."""
    share = len(evs) // threads_n
    t0 = time.perf_counter()
    threads = [threading.Thread(target=run_share, args=(evs[k * share : (k + 1) * share],)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return share * threads_n / (time.perf_counter() - t0)


def pipelined(log: AuditLog, evs: list, producers: int = 4) -> float:
    """Producers submit without waiting (many appends in flight), then wait for every ack."""

    def run(mine: list) -> None:
        futs = [log.submit(e) for e in mine]
        for f in futs:
            f.result()

    return _rate(evs, producers, run)


def blocking(log: AuditLog, evs: list, threads_n: int) -> float:
    """Each thread appends and waits for the ack before the next."""

    def run(mine: list) -> None:
        for e in mine:
            log.append(e)

    return _rate(evs, threads_n, run)


def start_witness(work: Path, log_vkeys: list[str]) -> tuple[subprocess.Popen, WitnessEndpoint]:
    """A real witness process on loopback (its own key and fsynced state)."""
    cmd = [sys.executable, "-m", "fak.cli", "witness", "serve", "--dir", str(work / "witness"),
           "--listen", "127.0.0.1:0"]
    for v in log_vkeys:
        cmd += ["--log", v]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()  # "witness <vkey> listening on <url>"
    if len(line) != 5:
        proc.kill()
        raise RuntimeError(f"witness did not start: {line}")
    return proc, WitnessEndpoint(line[4], line[1])


def cosign_figures(log: AuditLog, before: int, cosigned_before: int = 0, covers_before: int = 0) -> dict:
    """Checkpoints signed and cosigned since ``before``/``cosigned_before``; latencies (all); and
    coverage, the guarantee a verifier relies on: each checkpoint signed since ``before`` is
    covered by a stored cosigned checkpoint at least as large (checked on the stored rows), how
    long and how many entries after its signature (``covers_before``: the log's own measure of
    that, from the time it was signed until the covering line was stored), and the fraction of
    the log's entries inside the newest cosigned checkpoint."""
    (stats,) = log.witness_stats.values()
    lat, st = sorted(stats.latency_ms), sorted(stats.store_ms)
    (vkey,) = (w.vkey for w in log.witnesses)
    every = log.checkpoints()
    cps = every[before:]
    cosigned = [c.size for c in every if cosignatures(c.note, [vkey])]  # lines that verify
    uncovered = [c.size for c in cps if not any(s >= c.size for s in cosigned)]
    lag_ms = sorted(list(stats.cover_lag_ms)[covers_before:])
    lag_entries = list(stats.cover_lag_entries)[covers_before:]
    return {"cosigned": stats.cosigned - cosigned_before, "failures": stats.failures,
            "signed": len(cps),
            "uncovered_stored": len(uncovered), "uncovered_in_log": len(stats.uncovered),
            "cover_lag_ms_max": max(lag_ms) if lag_ms else None,
            "cover_lag_ms_p50": statistics.median(lag_ms) if lag_ms else None,
            "cover_lag_entries_max": max(lag_entries) if lag_entries else None,
            "covered_fraction": (max(cosigned) if cosigned else 0) / max(1, log.size()),
            "latency_ms_p50": statistics.median(lat) if lat else None,
            "latency_ms_p99": lat[int(len(lat) * 0.99)] if lat else None,
            "then_stored_ms_p50": statistics.median(st) if st else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--proof-size", type=int, default=1_000_000)
    ap.add_argument("--appends", type=int, default=100_000, help="events in each pipelined run")
    ap.add_argument("--workdir", help="where the SQLite files go (default: a temp dir, removed after)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fak-bench-audit-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"durability": "SQLite WAL, synchronous=FULL: every acknowledged append is fsynced"}
    witness = None
    try:
        keys = {}
        for name in ("append", "big", "plain"):  # one data dir (key, signer memory) per log
            with AuditLog.open(url=f"sqlite:///{work / name / 'probe.db'}", data_dir=work / name,
                               origin=f"bench.fak.local/{name}") as probe:
                keys[name] = probe.public_key()
        witness, endpoint = start_witness(work, [keys["append"], keys["big"]])
        results["witness"] = {"url": endpoint.url, "process": "fak witness serve (separate process, loopback)"}

        # 1. append throughput, remembering signer + one witness cosigning every checkpoint
        url = f"sqlite:///{work / 'append' / 'append.db'}"
        with AuditLog.open(url=url, data_dir=work / "append", witnesses=[endpoint]) as log:
            log.append(events(1)[0])  # warm up: schema, key, connections
            log.checkpoint()
            st = log.witness_stats[endpoint.url]
            before, cosigned_before, covers_before = len(log.checkpoints()), st.cosigned, len(st.cover_lag_ms)
            results["append_pipelined_eps"] = pipelined(log, events(args.appends))
            log.checkpoint()  # the tail: signed now, and the witness waited for (bounded)
            results["cosign_pipelined"] = cosign_figures(log, before, cosigned_before, covers_before)
            results["append_blocking_64_threads_eps"] = blocking(log, events(12_800), 64)
            results["append_blocking_8_threads_eps"] = blocking(log, events(4_000), 8)
            results["append_one_thread_no_group_commit_eps"] = blocking(log, events(1_000), 1)
            log.checkpoint()
            results["cosign_all"] = cosign_figures(log, 0)
        # peer: the same log without a witness
        url = f"sqlite:///{work / 'plain' / 'plain.db'}"
        with AuditLog.open(url=url, data_dir=work / "plain") as log:
            log.append(events(1)[0])
            results["append_pipelined_no_witness_eps"] = pipelined(log, events(args.appends))
        say(f"appends/s: {json.dumps({k: round(v) for k, v in results.items() if k.endswith('eps')})}")
        say(f"cosigning: {json.dumps(results['cosign_all'])}")

        # 2. inclusion-proof latency at proof_size entries, built through the real append path
        n = args.proof_size
        url = f"sqlite:///{work / 'big' / 'big.db'}"
        with AuditLog.open(url=url, data_dir=work / "big", witnesses=[endpoint]) as log:
            t0 = time.perf_counter()
            chunk = 50_000
            for start in range(0, n, chunk):
                pipelined(log, events(min(chunk, n - start), start))
                say(f"  built {min(start + chunk, n)}/{n}")
            results["build_seconds"] = time.perf_counter() - t0
            results["build_eps"] = n / results["build_seconds"]
            log.checkpoint()
            rng = random.Random(1)
            picks = [rng.randrange(n) for _ in range(2000)]
            lat = []
            for i in picks:
                t = time.perf_counter()
                proof = log.inclusion_proof(i)
                lat.append((time.perf_counter() - t) * 1000)
                assert proof.checkpoint is not None and proof.tree_size > i
            for i in picks[:200]:  # the proofs are right, outside the timing
                log.inclusion_proof(i).verify(log.entry(i).leaf_hash)
            results["proof_size"] = n
            results["proof_hashes"] = len(log.inclusion_proof(0).hashes)
            results["proof_latency_ms_p50"] = statistics.median(lat)
            results["proof_latency_ms_p99"] = sorted(lat)[int(len(lat) * 0.99)]
            t = time.perf_counter()
            for _ in range(200):
                log.consistency_proof(rng.randrange(1, n), n)
            results["consistency_latency_ms_mean"] = (time.perf_counter() - t) / 200 * 1000
            say(f"proof p50 {results['proof_latency_ms_p50']:.3f} ms at {n}")

            # 3. export + offline verify
            export = work / "export.log"
            t = time.perf_counter()
            log.export(export)
            results["export_eps"] = n / (time.perf_counter() - t)
            vkey = log.public_key()
            results["cosign_big"] = cosign_figures(log, 0)
        # the signer's check on open: every entry re-hashed against the remembered root
        t = time.perf_counter()
        with AuditLog.open(url=url, data_dir=work / "big") as log:
            results["reopen_signer_check_seconds"] = time.perf_counter() - t
            results["reopen_alarms"] = log.alarms
        t = time.perf_counter()
        report = verify_export(export, pubkey=vkey)
        results["verify_seconds"] = time.perf_counter() - t
        results["verify_ok"] = report.ok
        results["verify_eps"] = report.entries / results["verify_seconds"]
        results["verify_checkpoints"] = report.checkpoints
        # peer: raw re-hash only (the floor any verifier pays: SHA-256 of every leaf + tree)
        t = time.perf_counter()
        tree = merkle.MemoryTree()
        with open(export, "rb") as fh:
            for line in fh:
                if line.startswith(b"e "):
                    tree.append(line.rstrip(b"\n").split(b" ", 3)[3])
        results["rehash_only_eps"] = n / (time.perf_counter() - t)
        results["export_bytes"] = export.stat().st_size
        results["db_bytes"] = (work / "big" / "big.db").stat().st_size
    finally:
        if witness is not None:
            witness.terminate()
            witness.wait()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    def tgt(name: str, value: float, goal: float, op: str) -> dict:
        return {"name": name, "value": value, "target": goal, "op": op,
                "met": bool(value >= goal if op == ">=" else value <= goal)}

    cos = results["cosign_pipelined"]
    targets = [
        tgt("durable appends/s, SQLite, group commit, remembering signer + 1 witness",
            results["append_pipelined_eps"], 10_000, ">="),
        tgt("entries inside the newest cosigned checkpoint / log size (pipelined run)",
            cos["covered_fraction"], 1.0, ">="),
        tgt("signed checkpoints not covered by a stored cosigned one (pipelined run)",
            cos["uncovered_stored"], 0, "<="),
        tgt("max ms from a checkpoint's signature to a cosigned one covering it", cos["cover_lag_ms_max"],
            COVER_BOUND_MS, "<="),
        tgt(f"inclusion proof p50 ms at {n} entries", results["proof_latency_ms_p50"], 1.0, "<="),
    ]
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
    }
    print(f"\naudit benchmark ({machine['cpus']} CPUs, SQLite {machine['sqlite']}, WAL + synchronous=FULL)")
    rows = [
        ("appends/s, 4 producers pipelined (group commit, witness)", results["append_pipelined_eps"]),
        ("appends/s, same, no witness (peer)", results["append_pipelined_no_witness_eps"]),
        ("checkpoints signed / cosigned, pipelined run", f"{cos['signed']} / {cos['cosigned']}"),
        ("  signed, not covered by a cosigned one (stored rows)", cos["uncovered_stored"]),
        ("  ms until covered by a cosigned one, p50", cos["cover_lag_ms_p50"]),
        ("  ms until covered by a cosigned one, max", cos["cover_lag_ms_max"]),
        ("  entries until covered, max", cos["cover_lag_entries_max"]),
        ("  entries inside the newest cosigned checkpoint / size", cos["covered_fraction"]),
        ("cosigning latency p50 ms (proof, HTTP, witness fsync)", results["cosign_all"]["latency_ms_p50"]),
        ("cosigning latency p99 ms", results["cosign_all"]["latency_ms_p99"]),
        ("appends/s, 64 threads blocking append()", results["append_blocking_64_threads_eps"]),
        ("appends/s, 8 threads blocking append()", results["append_blocking_8_threads_eps"]),
        ("appends/s, 1 thread (no batching: 1 fsync each)", results["append_one_thread_no_group_commit_eps"]),
        ("group commit speed-up vs 1 thread", results["append_pipelined_eps"]
         / results["append_one_thread_no_group_commit_eps"]),
        (f"build {n} entries, appends/s", results["build_eps"]),
        ("inclusion proof p50 ms", results["proof_latency_ms_p50"]),
        ("inclusion proof p99 ms", results["proof_latency_ms_p99"]),
        ("consistency proof mean ms", results["consistency_latency_ms_mean"]),
        (f"reopen {n} entries: signer re-hash check, s", results["reopen_signer_check_seconds"]),
        ("export entries/s", results["export_eps"]),
        ("verify entries/s (full: parse, re-hash, roots, sigs)", results["verify_eps"]),
        ("re-hash only entries/s (peer floor)", results["rehash_only_eps"]),
    ]
    for label, value in rows:
        shown = f"{value:>14,.3f}" if isinstance(value, float | int) else f"{value!s:>14}"
        print(f"  {label:<56} {shown}")
    print("targets:")
    for t in targets:
        print(f"  {t['name']:<48} {t['value']:>12.4g} {t['op']} {t['target']:<8g} {'met' if t['met'] else 'MISSED'}")
    if args.json:
        out = {"bench": "audit", "machine": machine, "results": results, "targets": targets}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
