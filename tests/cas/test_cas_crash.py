"""Crash safety: a real child process putting blobs is SIGKILLed at a random
moment; afterwards the store opens, every listed ref reads back the exact bytes
the child meant to store, every acknowledged put is there, and no partial blob
is visible. The child is forked (not spawned) so a trial costs milliseconds."""

from __future__ import annotations

import os
import random
import select
import signal
import time

from fak.cas import CasStore
from fak.settings import StorageSettings

TRIALS = 50
CHUNK = 4096


def _payload(trial: int, i: int) -> bytes:
    """Deterministic content whose header names its own trial and index."""
    rng = random.Random(trial * 100_003 + i)
    body = rng.randbytes(rng.randint(0, 6 * CHUNK))
    return f"{trial}:{i}:".encode() + body


def _child(data_dir: str, url: str, trial: int, ack_fd: int) -> None:
    store = CasStore.open(data_dir, url, chunk_size=CHUNK)
    i = 0
    while True:
        ref = store.put(_payload(trial, i), "application/octet-stream", "acme")
        os.write(ack_fd, f"{ref.digest}\n".encode())
        i += 1


def _run_trial(data_dir: str, url: str, trial: int, rng: random.Random) -> list[str]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        os.close(read_fd)
        try:
            _child(data_dir, url, trial, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    # the kill lands at a random moment after the child's first acknowledged put (opening the
    # store takes a varying share of a loaded machine's time: a timer from the fork alone
    # often killed it before any put)
    acked = b""
    deadline = time.monotonic() + 60
    while b"\n" not in acked and time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], 1.0)
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            acked += chunk
    time.sleep(rng.uniform(0.0, 0.15))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, "child died before the kill"
    while chunk := os.read(read_fd, 65536):
        acked += chunk
    os.close(read_fd)
    return [line for line in acked.decode().splitlines() if line.startswith("blake3k:")]


def test_crash_during_put_leaves_store_consistent(db_url):
    data_dir = str(StorageSettings().data_dir)
    CasStore.open(data_dir, db_url).close()  # schema and KEK exist before the first kill
    rng = random.Random(int.from_bytes(os.urandom(4)))
    all_acked: set[str] = set()
    verified: set[str] = set()
    for trial in range(TRIALS):
        all_acked.update(_run_trial(data_dir, db_url, trial, rng))
        store = CasStore.open(data_dir, db_url, chunk_size=CHUNK)
        try:
            refs = store.list_refs("acme")
            listed = {r.digest for r in refs}
            assert all_acked <= listed, "an acknowledged put was lost"
            for ref in refs:
                if ref.digest not in verified:  # each ref is read once here, all again at the end
                    _check(store, ref)
                    verified.add(ref.digest)
            report = store.fsck()
            assert report.missing == [] and report.wrong_size == []
            assert report.live_refs == len(refs)
        finally:
            store.close()
    assert len(all_acked) > TRIALS  # the kills did land mid-stream, after real work
    # leftovers of killed writers are ciphertext without a key, and removable
    store = CasStore.open(data_dir, db_url, chunk_size=CHUNK)
    report = store.fsck(remove_orphans=True, older_than=0)
    print(f"acked={len(all_acked)} orphans={len(report.orphans)} temp={report.temp_removed}")
    assert report.orphans_removed == len(report.orphans)
    assert store.fsck().orphans == [] and list(store.backend.tmp_dir.iterdir()) == []
    refs = store.list_refs("acme")
    assert {r.digest for r in refs} >= all_acked
    for ref in refs:
        _check(store, ref)
    store.close()


def _check(store: CasStore, ref) -> None:
    data = store.get(ref, "acme")  # re-verifies hash, size and tags
    t, i, _ = data.split(b":", 2)
    assert data == _payload(int(t), int(i))
