"""Replicas of one deployment in one process (docs/scale-out.md): three Kernels named r0, r1,
r2 on one PostgreSQL governance plane and one data directory. The mechanism under
``fak serve --replicas N`` without Ray: placement, the withdrawal tasks every replica applies,
one forget receipt naming every replica, a peer standing in for one that is down.
(tests/api/test_scaleout.py runs the same on Ray Serve, with processes and SIGKILL.)"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from support.kernel_facade_helpers import LOUNGE, WEATHER
from support.pg import pg_scratch, pg_server_url

from fak import Kernel, Settings
from fak.audit.events import ForgetCompleted
from fak.audit.receipt import verify_receipt
from fak.cas.errors import CasError
from fak.errors import Conflict
from fak.kernel.withdrawal.replicas import Replication, SessionElsewhere
from fak.settings import SettingsError

pytestmark = pytest.mark.postgres

TENANT = "acme"
SECRET = b"Booking reference QX7Y2Z for passenger Ada Lovelace, card ending 4242, seat 14C."
SYSTEM = "You are a travel assistant. Answer briefly, quote booking references exactly."


@pytest.fixture
def plane(tmp_path) -> Iterator[dict[str, str]]:
    """Two private schemas on the local server: the state and the key database."""
    main, keys = f"fak_r_{secrets.token_hex(5)}", f"fak_k_{secrets.token_hex(5)}"
    with pg_scratch(f'CREATE SCHEMA "{main}"', f'DROP SCHEMA "{main}" CASCADE'), \
            pg_scratch(f'CREATE SCHEMA "{keys}"', f'DROP SCHEMA "{keys}" CASCADE'):
        base = pg_server_url()
        yield {"database_url": f"{base}?options=-csearch_path%3D{main}",
               "cas_key_url": f"{base}?options=-csearch_path%3D{keys}"}


@pytest.fixture
def opener(plane, tmp_path, tiny_dir, tiny_lm) -> Iterator[Callable[[str], Kernel]]:
    opened: list[Kernel] = []

    def open_replica(name: str) -> Kernel:
        s = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, replica=name, **plane)
        k = Kernel.open(s, model=tiny_lm, progress=None)
        opened.append(k)
        return k

    yield open_replica
    for k in opened:
        k.close()


def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the replica did not apply its withdrawal task in time"
        time.sleep(0.05)


def test_sqlite_is_refused(tmp_path, tiny_dir) -> None:
    with pytest.raises(SettingsError, match="database_url is unset"):
        Kernel.open(Settings(data_dir=tmp_path / "d", model_path=tiny_dir, replica="r0"), progress=None)


@pytest.mark.parametrize("replicas", [1, 2])
def test_fak_serve_replicas_refuses_sqlite_before_ray_starts(tmp_path, replicas: int) -> None:
    """``fak serve --replicas N`` checks what each replica's ``Kernel.open`` would refuse, N = 1
    included (it let one replica through, which then failed inside Ray)."""
    from fak.kernel.facade import check_replicated

    with pytest.raises(SettingsError, match=f"--replicas {replicas}: setting database_url is unset"):
        check_replicated(Settings(data_dir=tmp_path / "d"), replicas)
    with pytest.raises(SettingsError, match="at least 1 replica"):
        check_replicated(Settings(data_dir=tmp_path / "d"), 0)


def test_a_session_lives_on_one_replica(opener) -> None:
    r0, r1 = opener("r0"), opener("r1")
    s = r0.session(TENANT)
    s.append("system", SYSTEM)
    assert r1.placement_of(TENANT, s.id) == "r0" and r0.placement_of(TENANT, s.id) == "r0"
    assert r1.placement_of("other", s.id) is None
    with pytest.raises(SessionElsewhere) as caught:
        r1.session(TENANT, s.id)
    assert caught.value.replica == "r0" and caught.value.status == 421
    rep = r0.services.replication
    assert rep is not None
    with pytest.raises(Conflict, match="runs already"):  # one process per replica name
        Replication(r0.state.engine, "r0", rep.scope, b"k" * 32).join(wait_s=0.3)


def test_prefix_hits_are_scored_where_the_prefix_is(opener) -> None:
    r0, r1 = opener("r0"), opener("r1")
    s = r0.session(TENANT)
    s.append("system", SYSTEM)
    s.append("user", "Hello")
    prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is my lounge?"}]
    assert r0.prefix_hit_tokens(TENANT, prompt) > 0
    assert r1.prefix_hit_tokens(TENANT, prompt) == 0
    assert r0.prefix_hit_tokens("other-tenant", prompt) == 0  # a tenant's namespace only


def _holding(k: Kernel, generated: bool = False) -> tuple[str, str]:
    """A session of ``k`` holding SECRET (and a generated turn that attended to it): (session, ref)."""
    s = k.session(TENANT)
    s.append("system", SYSTEM)
    s.admit("weather", WEATHER)
    ref = s.admit("booking", SECRET).ref
    if generated:
        list(s.generate(max_tokens=4, min_tokens=4))
    s.append("user", "Thanks.")
    return s.id, ref


def test_one_forget_reaches_every_replica_with_one_receipt(opener) -> None:
    r0, r1, r2 = opener("r0"), opener("r1"), opener("r2")
    a, ref = _holding(r0)
    b, _ = _holding(r1)
    c, _ = _holding(r2, generated=True)  # its answer attended to the ref: it goes too
    r2.session(TENANT).admit("lounge", LOUNGE)  # a session without the ref keeps everything
    receipt = r1.forget(TENANT, ref, wait_replay=True)
    parts = {p.replica: p for p in receipt.replicas or []}
    assert sorted(parts) == ["r0", "r1", "r2"]
    assert all(p.applied_by == p.replica and p.sessions == 1 for p in parts.values())
    assert {x.session_id: x.replica for x in receipt.sessions} == {a: "r0", b: "r1", c: "r2"}
    assert any(u.kind == "generated_segment" and u.replica == "r2" for u in receipt.units_dropped)
    assert receipt.replay == "verified"  # every replica's sessions equal their independent replays
    assert verify_receipt(receipt, r0.audit.public_key()).ok
    event = r0.audit.entry(receipt.log_index).event
    assert isinstance(event, ForgetCompleted) and [p.replica for p in event.replicas or []] == ["r0", "r1", "r2"]
    for k in (r0, r1, r2):  # gone from every store view, and from every session
        with pytest.raises(CasError):
            k.store.get(ref, TENANT)
    for k, sid in ((r0, a), (r1, b), (r2, c)):
        live = [x for x in k.session(TENANT, sid).segments() if x.state.value == "live"]
        assert live and not any(ref in (x.ref, *x.provenance) for x in live)


def test_a_replica_that_is_down_is_stood_in_for(opener) -> None:
    r0, r1 = opener("r0"), opener("r1")
    r2 = opener("r2")
    c, ref = _holding(r2)
    fingerprint_before = r2.session(TENANT, c).fingerprint()
    r2.close()  # down: its lock is free
    receipt = r0.forget(TENANT, ref, wait_replay=True)
    parts = {p.replica: p for p in receipt.replicas or []}
    assert parts["r2"].applied_by == "r0" and parts["r2"].sessions == 1
    assert receipt.replay == "verified"
    assert r0.placement_of(TENANT, c) == "r0"  # rebuilt on the replica that stood in
    assert r0.session(TENANT, c).fingerprint() != fingerprint_before
    back = opener("r2")  # on its way back it owes nothing, and the session is not its own any more
    assert back.services.replication is not None
    assert back.services.replication.store.pending("r2") == []
    with pytest.raises(SessionElsewhere):
        back.session(TENANT, c)
    del r1


def test_quarantine_and_erase_reach_the_peers(opener) -> None:
    r0, r1 = opener("r0"), opener("r1")
    b, ref = _holding(r1)
    report = r0.quarantine(TENANT, ref, reason="late_injection")
    assert report.units == []  # nothing of it on r0: r1 evicts its own from its task

    def evicted() -> bool:
        return not any(x.ref == ref and x.state.value == "live" for x in r1.session(TENANT, b).segments())

    _eventually(evicted)
    erased = r0.erase_tenant(TENANT, confirm=TENANT)
    assert erased.sessions == 1
    assert r0.sessions(TENANT) == [] and r1.loaded_sessions(TENANT) == []


def test_a_policy_replaced_on_one_replica_is_loaded_by_every_replica(plane, tmp_path, tiny_dir, tiny_lm) -> None:
    from fak.kernel.facade import default_policy_path

    policy = tmp_path / "policy.yaml"
    policy.write_text(default_policy_path().read_text())
    kernels = [Kernel.open(Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, replica=name,
                                    policy_path=policy, **plane), model=tiny_lm, progress=None)
               for name in ("r0", "r1")]
    try:
        before = kernels[1].policy.digest
        policy.write_text(policy.read_text().replace("tier: default", "tier: replaced", 1))
        after = kernels[0].reload_policy(principal="key:op").digest
        assert after != before
        _eventually(lambda: kernels[1].policy.digest == after)
    finally:
        for k in kernels:
            k.close()


def test_a_session_taken_from_a_replica_that_is_down_carries_no_withdrawn_ref(opener) -> None:
    r0, r1, r2 = opener("r0"), opener("r1"), opener("r2")
    c, ref = _holding(r2)
    r2.close()  # down, with its session on it
    r0.quarantine(TENANT, ref, reason="late_injection")  # r2's task stays pending: nobody waits for it
    rep = r1.services.replication
    assert rep is not None and [t.kind for t in rep.store.pending("r2")] == ["quarantine"]
    ks = r1.session(TENANT, c)  # r2 is down: the session moves to r1, r2's task applied on its behalf first
    assert r1.placement_of(TENANT, c) == "r1"
    assert rep.store.pending("r2") == []
    assert not any(x.ref == ref and x.state.value == "live" for x in ks.segments())


def test_a_report_written_without_the_key_signs_nothing(opener) -> None:
    from fak.kernel.withdrawal.replicas import ReportForged

    r0 = opener("r0")
    rep = r0.services.replication
    assert rep is not None
    rep.store.add_tasks("fgt_forged", "forget", TENANT, [], ["r0", "r9"])
    rep.store.update("fgt_forged", "r9", state="dropped", applied_by="r9", units="[]", sessions="[]")
    rep.store.update("fgt_forged", "r0", state="dropped", applied_by="r0")
    assert [t.replica for t in rep.settle("fgt_forged", until="dropped", wait_s=1)] == ["r0", "r9"]
    with r0.state.engine.begin() as conn:  # someone with the database but not the key claims r9 dropped nothing
        conn.execute(sa.text("UPDATE fak_withdrawal_tasks SET sessions = '[]', units = '[{\"kind\": \"segment\"}]' "
                             "WHERE request_id = 'fgt_forged' AND replica = 'r9'"))
    with pytest.raises(ReportForged, match="r9"):
        rep.settle("fgt_forged", until="dropped", wait_s=1)


def test_a_replica_applies_what_it_missed_before_it_serves(opener) -> None:
    r0, r2 = opener("r0"), opener("r2")
    c, ref = _holding(r2)
    r2.close()  # down while the quarantine is decided on r0
    r0.quarantine(TENANT, ref, reason="late_injection")
    back = opener("r2")  # its open applies the pending task before it serves anything
    rep = back.services.replication
    assert rep is not None and rep.store.pending("r2") == []
    with back.state.engine.connect() as conn:
        applied = conn.execute(sa.text("SELECT applied_by FROM fak_withdrawal_tasks WHERE replica = 'r2' "
                                       "AND kind = 'quarantine'")).scalars().all()
    assert applied == ["r2"]  # by itself, on its way back (nobody stood in: nobody waited)
    assert back.placement_of(TENANT, c) == "r2"
    assert not any(x.ref == ref and x.state.value == "live" for x in back.session(TENANT, c).segments())
