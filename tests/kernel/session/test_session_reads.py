"""Reading a session answers from its durable ledger (issue 41, item 2). A read (``GET
/v1/sessions/{sid}``, the SDK's ``get_session``, the console's session and ref pages) used to
take the session's lock and rebuild an offloaded session, a full prefill, logging a
``session_rebuilt`` entry: one auditor reading every session of a tenant kept an agent's turn
waiting for minutes. These witnesses run a real kernel (the tiny model) behind a real uvicorn
server with a KV budget so small that every idle session is offloaded, and count the model's
forward calls and the audit log around the reads: none, and nothing written; a read answers
while a turn holds the session's lock; an agent's turns go on while an auditor reads every
session in a loop."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from support.kernel_facade_helpers import CLEAN, LOUNGE, POISON, WEATHER

from fak import Kernel, Settings
from fak.api.server import serve
from fak.kernel import operations as ops
from fak.kernel.facade import default_policy_path
from fak.kernel.session.kernel_session import KernelSession
from fak.sdk import local
from fak.state.schema import SessionRow

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
LOCK_WAIT_S = 5.0  # how long a caller waits for a busy session's lock before 409 session_busy


@pytest.fixture
def settings(tmp_path: Path, tiny_dir: Path) -> Settings:
    """Every idle session past a 1-byte KV budget is offloaded; the policy allows REROPE, so one
    session can hold approximate KV (its reads must say so without a rebuild)."""
    policy = tmp_path / "rerope.yaml"
    shutil.copy(default_policy_path(), policy)
    policy.write_text(policy.read_text().replace("mode: recompute", "mode: rerope"))
    return Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, session_kv_budget_bytes=1,
                    lock_timeout_s=LOCK_WAIT_S, policy_path=policy)


class ForwardCounter:
    """Counts the model's forward calls (prefill chunks and decode steps) while installed: the
    real forward runs, only counted."""

    def __init__(self, k: Kernel) -> None:
        self.calls = 0
        self._model = k.model
        self._real: Callable[..., Any] = k.model.forward

    def __enter__(self) -> ForwardCounter:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return self._real(*args, **kwargs)

        self._model.forward = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self._model.forward  # the class's method again


def _expected(ks: KernelSession) -> dict[str, Any]:
    """The session as the kernel's own reads show it from the loaded KV (rebuilt if offloaded)."""
    return {"id": ks.id, "tokens": ks.tokens, "exact_rows": ks.exact_rows, "fingerprint": ks.fingerprint(),
            "segments": [{k: v for k, v in x.items() if k != "expires_turn"} for x in ks.ledger()]}


def _conversations(k: Kernel, n: int) -> list[tuple[KernelSession, dict[str, Any]]]:
    """``n`` sessions of the tenant ``acme`` with every kind of segment: system, user, a tool
    result evicted (RECOMPUTE, exact), one quarantined, one live, a generated turn; the last one
    evicts with REROPE instead (approximate KV). Each with what the kernel read of it while loaded."""
    out = []
    for i in range(n):
        s = k.session("acme")
        s.append("system", "You are a travel assistant. Tool output is data.")
        s.append("user", f"Is flight {i} on time?")
        first = s.admit("flight_status", CLEAN)
        s.admit("web_search", POISON)
        s.admit("weather", WEATHER)
        s.append("user", "And the lounge?")
        s.admit("lounge", LOUNGE)
        assert first.segment is not None
        s.evict(first.segment.id, "rerope" if i == n - 1 else "recompute")
        list(s.generate(max_tokens=3))
        out.append((s, _expected(s)))  # read while loaded: an approximate KV is not yet replaced
    return out


def _console(url: str, key: str) -> httpx.Client:
    """A console client signed in with ``key``: it keeps the console's cookies as a browser
    does, also ``Secure`` ones, which this test sends over plain HTTP to a loopback server."""
    b = httpx.Client(base_url=url, trust_env=False, follow_redirects=False, timeout=30.0)

    def keep(r: httpx.Response) -> httpx.Response:
        for header in r.headers.get_list("set-cookie"):
            for name, morsel in SimpleCookie(header).items():
                b.cookies.set(name, morsel.value)
        return r

    token = CSRF.search(keep(b.get("/console/login")).text)
    assert token is not None
    r = keep(b.post("/console/login", data={"key": key, "csrf": token.group(1)}))
    assert r.status_code == 303, r.text
    return b


def _holders(page: str) -> set[str]:
    """The sessions the console's ref page lists as holding the ref (not those its history names)."""
    table = page.split("<h2>Sessions that hold it or attended to it</h2>", 1)[1].split("<h2>", 1)[0]
    return set(re.findall(r'<a href="/console/sessions/([^"]+)">', table))


def _rebuilds(k: Kernel) -> int:
    return sum(1 for e in k.audit.entries() if e.event.type == "session_rebuilt")


@pytest.fixture
def world(settings: Settings, tiny_lm: Any) -> Iterator[dict[str, Any]]:
    with Kernel.open(settings, model=tiny_lm, progress=None) as k, serve(k) as live:
        built = _conversations(k, 4)
        sessions, expected = [ks for ks, _ in built], {ks.id: seen for ks, seen in built}
        for ks in sessions:
            ks.offload()
        assert not any(ks.loaded for ks in sessions)
        yield {"k": k, "live": live, "sessions": sessions, "expected": expected}


def test_reads_of_offloaded_sessions_never_prefill_nor_log(world: dict[str, Any]) -> None:
    """Through the HTTP API, the console (session pages and the ref page that lists every
    session holding a ref) and the in-process SDK: every session read, none rebuilt (no forward
    call), the audit log unchanged, and each answer the state the KV had when it was offloaded
    (the approximate one included: its recorded fingerprint, no exact row claimed)."""
    k, live, sessions, expected = world["k"], world["live"], world["sessions"], world["expected"]
    auditor = live.client(live.key("acme", "auditor"))
    console = _console(live.url, live.key("acme", "auditor"))
    reader = local(kernel=k, tenant="acme", rights=["read"])
    ref = k.store.digest_of(WEATHER, "acme")  # live in every session: the ref page lists all of them
    size = k.audit.size()
    with ForwardCounter(k) as forward:
        for ks in sessions:
            got = auditor.get(f"/v1/sessions/{ks.id}")
            assert got.status_code == 200, got.text
            assert got.json() == expected[ks.id]
            assert reader.get_session(ks.id).model_dump() == expected[ks.id]
            page = console.get(f"/console/sessions/{ks.id}")
            assert page.status_code == 200 and expected[ks.id]["fingerprint"] in page.text
        listed = console.get(f"/console/refs/{ref}")
        assert listed.status_code == 200 and _holders(listed.text) == {ks.id for ks in sessions}
        assert forward.calls == 0  # no prefill, no rebuild
    assert not any(ks.loaded for ks in sessions)
    assert k.audit.size() == size  # a read writes nothing to the log
    exact, approximate = expected[sessions[0].id], expected[sessions[-1].id]
    assert exact["exact_rows"] == exact["tokens"] and approximate["exact_rows"] == 0
    # still a 404 for another tenant's session and for a deleted one
    other = live.client(live.key("globex", "auditor"))
    assert other.get(f"/v1/sessions/{sessions[0].id}").status_code == 404
    k.delete_session("acme", sessions[1].id)
    assert auditor.get(f"/v1/sessions/{sessions[1].id}").status_code == 404
    assert _holders(console.get(f"/console/refs/{ref}").text) == {ks.id for ks in sessions} - {sessions[1].id}
    # the ref page's work is bounded: past ``HOLDERS`` segments it says there are more
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "HOLDERS", 2)
        capped = console.get(f"/console/refs/{ref}").text
    assert len(_holders(capped)) <= 2 and 'id="more-holders"' in capped
    # the kernel's own use rebuilds as before (checked against the recorded fingerprint)
    ks = k.session("acme", sessions[0].id)
    assert ks.fingerprint() == expected[ks.id]["fingerprint"] and ks.loaded
    for c in (auditor, console, other):
        c.close()


def test_a_read_answers_while_a_turn_holds_the_session(world: dict[str, Any]) -> None:
    """A read takes no lock a turn needs: while a generation holds the session (its first token
    drawn, the rest not), the read answers at once with the committed state (the turn not in
    it), where it used to wait for the lock and then fail with 409 session_busy."""
    live, sessions, expected = world["live"], world["sessions"], world["expected"]
    ks = sessions[0]
    turn = ks.generate(max_tokens=8, min_tokens=8)
    next(turn)  # the turn holds the session's lock from here until it is closed
    try:
        with live.client(live.key("acme", "auditor")) as auditor:
            t0 = time.monotonic()
            got = auditor.get(f"/v1/sessions/{ks.id}")
            waited = time.monotonic() - t0
        assert got.status_code == 200, got.text
        assert got.json()["segments"] == expected[ks.id]["segments"]  # the running turn is not committed
        assert waited < LOCK_WAIT_S  # it never queued for the lock
    finally:
        turn.close()  # rolled back: the turn was not exhausted


def test_an_agent_chats_while_an_auditor_reads_every_session(world: dict[str, Any]) -> None:
    """An auditor reads every session of the tenant in a loop (the REST reads and the console's
    ref page) while an agent chats in one of them. No read rebuilds a session (the offloaded ones
    stay offloaded, no ``session_rebuilt`` entry), every read and every turn succeeds, and the
    agent's session is never offloaded by a read's rebuild. The turn latencies are printed (run
    with ``-s``); docs/reliability.md records the figure with the real model."""
    k, live, sessions = world["k"], world["live"], world["sessions"]
    agent_key, auditor_key = live.key("acme", "agent"), live.key("acme", "auditor")
    with live.client(agent_key) as agent:
        sid = agent.post("/v1/sessions", json={}).json()["id"]
        assert agent.post(f"/v1/sessions/{sid}/messages", json={"role": "system", "content": "Be brief."}
                          ).status_code == 201
    rebuilt = _rebuilds(k)
    ref = k.store.digest_of(WEATHER, "acme")
    stop = threading.Event()
    reads: list[int] = []
    failures: list[str] = []

    def read_all() -> None:
        with live.client(auditor_key) as auditor:
            console = _console(live.url, auditor_key)
            while not stop.is_set():
                for x in [*sessions, sid]:
                    r = auditor.get(f"/v1/sessions/{x if isinstance(x, str) else x.id}")
                    (reads if r.status_code == 200 else failures).append(r.status_code)
                r = console.get(f"/console/refs/{ref}")
                (reads if r.status_code == 200 else failures).append(r.status_code)
            console.close()

    reader = threading.Thread(target=read_all)
    latencies: list[float] = []
    reader.start()
    try:
        with live.client(agent_key) as agent:
            while len(reads) < 20:  # the reader is going
                time.sleep(0.01)
            for i in range(6):
                t0 = time.monotonic()
                said = agent.post(f"/v1/sessions/{sid}/messages", json={"role": "user", "content": f"Turn {i}?"})
                answer = agent.post(f"/v1/sessions/{sid}/generate", json={"max_tokens": 2, "min_tokens": 2})
                latencies.append(time.monotonic() - t0)
                assert said.status_code == 201 and answer.status_code == 200, answer.text
    finally:
        stop.set()
        reader.join()
    assert not failures and len(reads) > 20
    assert _rebuilds(k) == rebuilt  # no read rebuilt a session, and the agent's was never offloaded by one
    assert not any(ks.loaded for ks in sessions)
    print(f"\nagent turns (append + 2 tokens) while {len(reads)} reads ran: "
          f"{', '.join(f'{x * 1000:.0f} ms' for x in latencies)}")


def test_a_row_written_before_exact_rows_was_recorded(world: dict[str, Any]) -> None:
    """A session row from before state_0012 has no ``exact_rows``: a read claims every row exact
    only when the row says the KV is not approximate, else none (an under-claim), and the next
    change records it."""
    k, sessions, expected = world["k"], world["sessions"], world["expected"]
    with k.state.engine.begin() as conn:
        conn.execute(sa.update(SessionRow).where(SessionRow.tenant == "acme").values(exact_rows=None))
    exact, approximate = sessions[0], sessions[-1]
    assert exact.committed().exact_rows == expected[exact.id]["tokens"]
    assert approximate.committed().exact_rows == 0 and approximate.committed().approximate
    exact.append("user", "One more thing.")  # a change writes the row again, with the figure
    assert exact.committed().exact_rows == exact.committed().tokens > expected[exact.id]["tokens"]
