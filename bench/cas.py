"""CAS throughput on SQLite: put and get MB/s for 1 KiB and 1 MiB blobs, with and
without encryption, plus the pieces that bound them (BLAKE3, AES-GCM, fsync) so a
missed target names its bottleneck, and what erasure costs (forget, rotate, destroy).

    python bench/cas.py [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path

KIB, MIB = 1024, 1024 * 1024
TARGET_PUT_MIB_ENC = 200.0  # MB/s, 1 MiB puts with encryption


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def _bench_store(encrypt: bool, size: int, count: int, fsync: bool = True) -> dict[str, float]:
    from fak.cas import CasStore

    with tempfile.TemporaryDirectory(prefix="fak-bench-cas-") as tmp:
        store = CasStore.open(tmp, f"sqlite:///{tmp}/fak.db", master_secret=secrets.token_bytes(32),
                              encrypt=encrypt, fsync=fsync)  # fmt: skip
        blobs = [secrets.token_bytes(size) for _ in range(count)]
        store.put(secrets.token_bytes(size), "application/octet-stream", "bench")  # warm-up
        t0 = time.perf_counter()
        refs = [store.put(b, "application/octet-stream", "bench") for b in blobs]
        t_put = time.perf_counter() - t0
        t0 = time.perf_counter()
        for ref in refs:
            store.get(ref, "bench")
        t_get = time.perf_counter() - t0
        store.close()
    total = size * count
    return {
        "put_mbps": _mbps(total, t_put),
        "get_mbps": _mbps(total, t_get),
        "put_ms": t_put / count * 1e3,
        "get_ms": t_get / count * 1e3,
        "count": count,
    }


def _bench_erasure(count: int) -> dict[str, float]:
    """What erasure costs on SQLite: forget (key delete + blob delete + WAL checkpoint),
    rotate (re-wrap every live data key under a new KEK) and destroy_retired."""
    from fak.cas import CasStore

    with tempfile.TemporaryDirectory(prefix="fak-bench-erase-") as tmp:
        store = CasStore.open(tmp, f"sqlite:///{tmp}/fak.db", master_secret=secrets.token_bytes(32))
        refs = [store.put(secrets.token_bytes(KIB), "application/octet-stream", "bench") for _ in range(count)]
        t0 = time.perf_counter()
        rotated = store.rotate()
        t_rotate = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.destroy_retired(0)
        t_destroy = time.perf_counter() - t0
        victims = refs[: max(1, count // 10)]
        t0 = time.perf_counter()
        statuses = [store.forget(r.digest, "bench").shred_status for r in victims]
        t_forget = (time.perf_counter() - t0) / len(victims)
        store.close()
    return {
        "keys": count,
        "rotate_keys_per_s": rotated.rewrapped / t_rotate,
        "destroy_retired_ms": t_destroy * 1e3,
        "forget_ms": t_forget * 1e3,
        "forget_destroyed_fraction": statuses.count("destroyed") / len(statuses),
    }


def _primitives(size: int = MIB, reps: int = 64) -> dict[str, float]:
    """Raw speed of the pieces of a put: hashing, sealing, and one fsynced file write."""
    from fak.cas import crypto
    from fak.cas.digest import compute

    data = secrets.token_bytes(size)
    t0 = time.perf_counter()
    for _ in range(reps):
        compute(data, b"k" * 32)
    t_hash = time.perf_counter() - t0
    sealer = crypto.Sealer(crypto.new_data_key(), b"\x00" * 16)
    t0 = time.perf_counter()
    for _ in range(reps):
        for i, (piece, final) in enumerate(crypto.chunked(data, crypto.DEFAULT_CHUNK)):
            sealer.seal(i, piece, final)
    t_seal = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="fak-bench-fsync-") as tmp:
        t0 = time.perf_counter()
        for i in range(16):
            with open(Path(tmp) / f"f{i}", "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        t_fsync = (time.perf_counter() - t0) / 16
    return {
        "blake3_keyed_mbps": _mbps(size * reps, t_hash),
        "aes_gcm_seal_mbps": _mbps(size * reps, t_seal),
        "write_fsync_1mib_ms": t_fsync * 1e3,
        "write_fsync_1mib_mbps": _mbps(size, t_fsync),
    }


def _machine() -> dict[str, object]:
    import cryptography
    from cryptography.hazmat.backends.openssl import backend

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cryptography": cryptography.__version__,
        "openssl": backend.openssl_version_text(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the result object to PATH")
    parser.add_argument("--quick", action="store_true", help="fewer blobs (smoke run)")
    args = parser.parse_args(argv)
    n_small, n_big = (50, 8) if args.quick else (400, 64)

    results: dict[str, object] = {}
    for label, size, count in (("1KiB", KIB, n_small), ("1MiB", MIB, n_big)):
        for enc in (True, False):
            results[f"{label}_{'encrypted' if enc else 'plain'}"] = _bench_store(enc, size, count)
    results["1MiB_encrypted_nofsync"] = _bench_store(True, MIB, n_big, fsync=False)
    results["primitives"] = prim = _primitives()
    results["erasure"] = _bench_erasure(200 if args.quick else 2000)
    for label in ("1KiB", "1MiB"):
        e, p = results[f"{label}_encrypted"], results[f"{label}_plain"]
        results[f"{label}_overhead"] = {
            "put_ratio_plain_over_encrypted": p["put_mbps"] / e["put_mbps"],
            "get_ratio_plain_over_encrypted": p["get_mbps"] / e["get_mbps"],
        }
    put_enc = results["1MiB_encrypted"]["put_mbps"]
    nofsync = results["1MiB_encrypted_nofsync"]["put_mbps"]
    bottleneck = (
        f"durability: one fsynced 1 MiB file write alone runs at {prim['write_fsync_1mib_mbps']:.0f} MB/s "
        f"and the same puts without fsync reach {nofsync:.0f} MB/s; BLAKE3 {prim['blake3_keyed_mbps']:.0f} MB/s, "
        f"AES-GCM {prim['aes_gcm_seal_mbps']:.0f} MB/s"
    )
    results["bottleneck"] = bottleneck
    targets = [
        {"name": "put_1MiB_encrypted_mbps", "value": round(put_enc, 1), "target": TARGET_PUT_MIB_ENC,
         "op": ">=", "met": put_enc >= TARGET_PUT_MIB_ENC},
    ]  # fmt: skip

    print(f"{'case':<26}{'put MB/s':>10}{'get MB/s':>10}{'put ms':>9}{'get ms':>9}")
    for key, r in results.items():
        if isinstance(r, dict) and "put_mbps" in r:
            print(f"{key:<26}{r['put_mbps']:>10.1f}{r['get_mbps']:>10.1f}{r['put_ms']:>9.2f}{r['get_ms']:>9.2f}")
    for label in ("1KiB", "1MiB"):
        o = results[f"{label}_overhead"]
        print(f"encryption overhead {label}: put x{o['put_ratio_plain_over_encrypted']:.2f}, "
              f"get x{o['get_ratio_plain_over_encrypted']:.2f} (plain / encrypted)")  # fmt: skip
    print("primitives: " + ", ".join(f"{k}={v:.1f}" for k, v in prim.items()))
    print("erasure (SQLite): " + ", ".join(f"{k}={v:.2f}" for k, v in results["erasure"].items()))
    for t in targets:
        print(f"target {t['name']}: {t['value']} {t['op']} {t['target']} -> {'met' if t['met'] else 'NOT met'}")
    print(f"bottleneck: {bottleneck}")
    if args.json:
        out = {"bench": "cas", "machine": _machine(), "results": results, "targets": targets}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
