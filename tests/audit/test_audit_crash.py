"""SIGKILL a real child process appending under load, 50 times: the log reopens,
stays gap-free and verifiable, and every acknowledged append is present.

Each trial forks the already-imported test process (cheap: no interpreter start),
the child appends from 4 threads and reports each acknowledged index on a pipe,
and is killed after a short random delay."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from fak.audit import AuditLog, PolicyLoaded, verify_export

P = "sha256:" + "cd" * 32
TRIALS = 50

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _child(url: str, data_dir: str, trial: int, wfd: int) -> None:
    try:
        log = AuditLog.open(url=url, data_dir=data_dir, checkpoint_every=25, checkpoint_ms=20)
        os.write(wfd, b"ready\n")  # opening rehashes the whole log (the signer's check): kill after it

        def worker(k: int) -> None:
            n = 0
            while True:
                pid = f"t{trial}-{k}-{n}"
                idx = log.append(PolicyLoaded(policy_id=pid, policy_digest=P))
                os.write(wfd, f"{idx} {pid}\n".encode())
                n += 1

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(60)  # killed long before
    finally:
        os._exit(0)


def _trial(url: str, data_dir: str, trial: int, delay: float) -> list[tuple[int, str]]:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _child(url, data_dir, trial, wfd)
    os.close(wfd)
    first = b""
    while not first.endswith(b"\n"):
        got = os.read(rfd, 1)
        if not got:
            break
        first += got
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    lines = [ln for ln in b"".join(chunks).decode().splitlines() if ln != "ready"]
    return [(int(i), p) for i, p in (line.split() for line in lines)]


def test_crash_during_append(tmp_path):
    url, data_dir = f"sqlite:///{tmp_path / 'fak.db'}", str(tmp_path)
    with AuditLog.open(url=url, data_dir=data_dir) as log:  # schema and key exist before the first kill
        vkey = log.public_key()
    rng = random.Random(1234)
    acked_total, trials_with_acks = 0, 0
    for trial in range(TRIALS):
        acked = _trial(url, data_dir, trial, rng.uniform(0.05, 0.2))
        acked_total += len(acked)
        trials_with_acks += bool(acked)
        with AuditLog.open(url=url, data_dir=data_dir) as log:
            size = log.size()
            for idx, pid in acked:
                assert log.entry(idx).event.policy_id == pid, f"trial {trial}: acknowledged entry {idx} lost"
            tail = [e.index for e in log.entries(start=max(0, size - 200))]
            assert tail == list(range(max(0, size - 200), size)), f"trial {trial}: gap in the log"
            log.checkpoint()  # checks consistency with the last checkpoint the child signed
            assert log.alarms == 0, f"trial {trial}: a crash made the signer raise an alarm"
            if trial % 10 == 9:
                log.export(tmp_path / "export.log")
                report = verify_export(tmp_path / "export.log", pubkey=vkey)
                assert report.ok, f"trial {trial}: {report.summary()}"
                assert report.entries == size
    assert trials_with_acks >= TRIALS * 0.8  # the children really were appending when killed
    assert acked_total > TRIALS * 10
