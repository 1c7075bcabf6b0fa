"""SIGKILL the real server at random moments under load, ``--trials`` times (20), on one
data directory, and check after every restart that nothing acknowledged was lost:

- every acknowledged admission: its ref reads back (bytes verified by the server against
  digest, size and tags; 410 only if a forget of it was sent), its audit entry has an
  inclusion proof, its segment is in its session;
- every acknowledged message is in its session's ledger; every session answers (rebuilt);
- every acknowledged forget is ``completed``; a forget in flight at the kill is finished
  by the restart (no forget left ``requested`` at the end);

and at the end, offline: the audit log verifies and holds exactly one event per
acknowledged decision, ``fsck`` finds no missing or wrong-sized blob (what killed writers
left are orphans it removes), and sampled sessions rebuild to the fingerprint of an
independent replay.

    python bench/faults.py --json bench/out/faults.json [--trials 20 --clients 16]
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx
from common import log, parser, report, target
from load import Ledger, Server, check_log, create_keys, drive

TENANTS = ("load-a", "load-b", "load-c", "load-d")


def check_after_restart(base: str, keys: dict, led: Ledger, forgotten_tried: set[str]) -> dict[str, int]:
    """HTTP checks of everything acknowledged so far; returns counts of what was checked and lost."""
    out = {"admissions": 0, "messages": 0, "forgets": 0, "sessions": 0, "lost": 0, "examples": []}
    clients = {(t, r): httpx.Client(base_url=base, headers={"Authorization": f"Bearer {keys[t, r]}"}, timeout=300,
                                    trust_env=False) for t in TENANTS for r in ("agent", "auditor")}

    def lost(what: str) -> None:
        out["lost"] += 1
        if len(out["examples"]) < 10:
            out["examples"].append(what)

    ledgers: dict[tuple[str, str], dict] = {}

    def session(tenant: str, sid: str) -> dict | None:
        if (tenant, sid) not in ledgers:
            r = clients[tenant, "auditor"].get(f"/v1/sessions/{sid}")
            ledgers[tenant, sid] = r.json() if r.status_code == 200 else None
            out["sessions"] += 1
        return ledgers[tenant, sid]

    try:
        for index, a in led.admissions.items():
            out["admissions"] += 1
            t = a["tenant"]
            r = clients[t, "agent"].get(f"/v1/refs/{a['ref']}")
            if not (r.status_code == 200 or (r.status_code == 410 and a["ref"] in forgotten_tried)):
                lost(f"admission {index}: ref {r.status_code}")
            p = clients[t, "auditor"].get(f"/v1/audit/proof/inclusion/{index}")
            if p.status_code != 200:
                lost(f"admission {index}: proof {p.status_code}")
            s = session(t, a["session"])
            if s is None:
                lost(f"admission {index}: session {a['session']} gone")
            elif a["ref"] not in {x["ref"] for x in s["segments"]} and a["ref"] not in forgotten_tried:
                lost(f"admission {index}: not in session {a['session']}")
        for m in led.messages:
            out["messages"] += 1
            s = session(m["tenant"], m["session"])
            if s is None or m["segment"] not in {x["id"] for x in s["segments"]}:
                lost(f"message {m['segment']} of {m['session']}")
        for rid, f in led.forgets.items():
            out["forgets"] += 1
            r = clients[f["tenant"], "auditor"].get(f"/v1/forget/{rid}")
            if r.status_code != 200 or r.json().get("state") != "completed":
                lost(f"forget {rid}: {r.status_code} {r.text[:100]}")
    finally:
        for c in clients.values():
            c.close()
    return out


async def trial(server: Server, keys: dict, led: Ledger, clients: int, kill_after: float, seed: int) -> dict:
    stop = asyncio.Event()

    async def killer() -> None:
        await asyncio.sleep(kill_after)
        server.kill()
        stop.set()

    k = asyncio.create_task(killer())
    await drive(server.base, keys, clients, kill_after + 60, 10**7, led, seed, stop=stop)
    await k
    return {}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--min-s", type=float, default=4.0, help="earliest kill, seconds into a trial's load")
    p.add_argument("--max-s", type=float, default=15.0)
    p.add_argument("--sample-sessions", type=int, default=30, help="sessions replayed offline at the end")
    p.add_argument("--database-url", help="default: SQLite in the run's data directory")
    p.add_argument("--seed", type=int, default=19)
    args = p.parse_args()
    if not 1 <= args.trials <= 500 or not 1 <= args.clients <= 256 or not 0 < args.min_s <= args.max_s <= 600:
        raise SystemExit("--trials in [1, 500], --clients in [1, 256], 0 < --min-s <= --max-s <= 600")
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="fak-faults-"))
    data_dir = tmp / "data"
    data_dir.mkdir(mode=0o700)
    url = args.database_url or f"sqlite:///{data_dir / 'fak.db'}"
    keys = create_keys(data_dir, url)
    server = Server(data_dir, url, env={"FAK_SESSION_KV_BUDGET_BYTES": str(1024 << 20)})
    led = Ledger()
    trials = []
    lost_total = 0
    t_start = time.monotonic()
    for i in range(args.trials):
        up = server.start()
        kill_after = rng.uniform(args.min_s, args.max_s)
        before = sum(len(v) for v in led.latencies.values())
        asyncio.run(trial(server, keys, led, args.clients, kill_after, rng.randrange(2**31)))
        answered = sum(len(v) for v in led.latencies.values()) - before
        restart = server.start()  # the restart finishes any forget the kill interrupted
        forgotten_tried = {f["ref"] for f in led.forgets.values()} | set(led_inflight_forgets(led))
        checked = check_after_restart(server.base, keys, led, forgotten_tried)
        server.stop()
        lost_total += checked["lost"]
        trials.append({"trial": i, "kill_after_s": kill_after, "requests_answered": answered,
                       "start_s": up, "restart_s": restart, **checked})
        log(f"trial {i + 1}/{args.trials}: killed after {kill_after:.1f} s ({answered} answered), restart "
            f"{restart:.1f} s, checked {checked['admissions']} admissions {checked['messages']} messages "
            f"{checked['forgets']} forgets, lost {checked['lost']} {checked['examples'][:2]}")
    # offline, on the stopped server's data
    audit = check_log(data_dir, url, led)
    offline = offline_checks(data_dir, url, args.sample_sessions, rng)
    results = {"trials": args.trials, "clients": args.clients, "seconds": time.monotonic() - t_start,
               "database": "postgresql" if url.startswith("postgresql") else "sqlite",
               "acknowledged": {"admissions": len(led.admissions), "messages": len(led.messages),
                                "forgets": len(led.forgets)},
               "in_flight_at_kills": dict(led.inflight), "lost": lost_total, "audit": audit, "offline": offline,
               "per_trial": trials, "data_dir": str(data_dir)}
    print(f"  {args.trials} kills; acknowledged {results['acknowledged']}; lost {lost_total}; audit {audit}; "
          f"offline {offline}")
    targets = [
        target("SIGKILL trials", args.trials, 20, ">="),
        target("acknowledged operations lost", lost_total, 0, "<="),
        target("audit log verifies (1 = yes)", float(audit["verifies"]), 1, ">="),
        target("exactly one event per acknowledged decision (1 = yes)",
               float(audit["exactly_one_event_per_acknowledged_decision"]), 1, ">="),
        target("forgets left pending after restart", offline["pending_forgets"], 0, "<="),
        target("CAS blobs missing or partial", offline["missing"] + offline["wrong_size"], 0, "<="),
        target("sampled sessions not rebuilding to their replay", offline["sessions_mismatched"], 0, "<="),
    ]
    report("faults", results, targets, args.json)


def led_inflight_forgets(led: Ledger) -> list[str]:
    """Refs whose forget was sent and not answered (the clients drop them from their lists)."""
    return list(led.forget_refs_sent)


def offline_checks(data_dir: Path, url: str, sample: int, rng: random.Random) -> dict:
    from fak import Kernel, Settings
    from fak.cas import CasStore

    out: dict = {}
    with CasStore.open(data_dir, url) as store:
        rep = store.fsck()
        out["missing"], out["wrong_size"], out["orphans"] = len(rep.missing), len(rep.wrong_size), len(rep.orphans)
        rm = store.fsck(remove_orphans=True, older_than=0)
        out["orphans_removed"] = rm.orphans_removed
    settings = Settings(data_dir=data_dir, database_url=url, session_kv_budget_bytes=256 << 20)
    with Kernel.open(settings, progress=None) as k:
        out["pending_forgets"] = len(k.state.pending_forgets())
        ids = [(t, sid) for t in TENANTS for sid in k.sessions(t)]
        picked = rng.sample(ids, min(sample, len(ids)))
        bad = 0
        for t, sid in picked:
            ks = k.session(t, sid)
            if ks.fingerprint() != ks.replay_fingerprint():
                bad += 1
            ks.offload()
        out["sessions"] = len(ids)
        out["sessions_replayed"] = len(picked)
        out["sessions_mismatched"] = bad
    return out


if __name__ == "__main__":
    main()
