"""API keys: ``fak_<key id>_<secret>``, stored as a keyed hash (HMAC-SHA256 under a key
derived from the master secret), compared in constant time, mapped to one tenant and
one role, optionally with an expiry. The key is shown once, when it is created.

The keyed hash proves who holds a key, not what its row says; so every row also carries a
MAC (``fak.state.apikeys``) over its id, tenant, role, hash, revocation and expiry under a
second key derived from the master secret, which is not in the database. A row that fails
its MAC is refused exactly as an unknown key is (401, nothing says the row exists) and
raises a ``key_alarm`` audit event (one per key and window). Creating and revoking a key
are audited too (``key_created``, ``key_revoked``: id, tenant, role, expiry; never the key),
logged before the row changes.

The MAC binds a row's fields, not its history: a whole earlier row of the same key (a
backup taken before its revocation) carries a valid MAC. The signed audit log holds that
history (removing an entry from it is a history rewrite the signer detects), so a key whose
row says active is refused all the same when the log holds its ``key_revoked``, or a
``tenant_erased`` of its tenant logged after its ``key_created`` (``_LogRevocations``:
read once, then the new entries at most every ``REFRESH_S``; another process's revocation
is honoured by the row at once and by the log within that interval)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from fak.db import WRITE
from fak.errors import FakError, InvalidInput, NotFound
from fak.state.apikeys import MAC_LABEL, intact, row_mac
from fak.state.schema import ApiKeyRow
from fak.state.store import now_us
from fak.types import check_id, check_tenant

if TYPE_CHECKING:
    from fak.kernel.facade import Kernel
    from fak.protocols import AuditSink
    from fak.settings import Settings

PREFIX = "fak_"
HASH_LABEL = "fak/api/key-hash"
ALARM_WINDOW_S = 60.0  # at most one key_alarm per key in this many seconds
ALARM_KEYS = 4096  # keys whose alarm window is remembered (oldest forgotten first)
MAX_LIFETIME_S = 100 * 365 * 86400  # an expiry further out is a typo, not a policy
REFRESH_S = 1.0  # revocations other processes log are read at most this long after (plus one query)
LOG_TYPES = ("key_created", "key_revoked", "tenant_erased")  # the audit events that say what a key may do

__all__ = ["HASH_LABEL", "MAC_LABEL", "PREFIX", "REFRESH_S", "Check", "KeyStore", "Principal", "Role",
           "open_key_store"]


class Role(StrEnum):
    AGENT = "agent"  # sessions, tool results, generation, chat completions
    AUDITOR = "auditor"  # the tenant's audit rows, proofs, receipts (read only)
    ADMIN = "admin"  # everything of the tenant, forget, and the policy
    APPROVER = "approver"  # a person deciding held tool calls (never an agent: it cannot chat)


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    role: Role
    expires_us: int | None = None  # when the key stops working (None: never)


@dataclass(frozen=True)
class Check:
    """The outcome of presenting a key: a principal, or why not (for the AuthFailure event).
    A key whose row fails its MAC reads ``unknown_key`` here, as the client sees it; the
    ``key_alarm`` event says what happened."""

    principal: Principal | None
    reason: str | None  # missing_key | unknown_key | revoked_key | expired
    fingerprint: str | None  # keyed digest of the presented key, never the key


@dataclass(frozen=True)
class _NoRow:
    """Stands in for a missing row so an unknown key costs what a known one does (one hash,
    one MAC, two constant-time compares)."""

    key_id: str = ""
    tenant: str = ""
    role: str = ""
    hash: str = "0" * 64
    revoked_us: int | None = None
    expires_us: int | None = None
    mac: str | None = None


class _AlarmWindow:
    """One alarm per key per ``window_s``; the refusals in between are counted into the next.
    Bounded: at most ``max_keys`` keys remembered (a MAC failure needs the real key of an
    edited row, so their number is that of the edited rows, not of the requests)."""

    def __init__(self, window_s: float, max_keys: int = ALARM_KEYS) -> None:
        self._window, self._max = window_s, max_keys
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()  # key id -> (last alarm, refused since)
        self._lock = threading.Lock()

    def note(self, key_id: str) -> int | None:
        """Count a refusal; the refusals to report when an alarm is due now, else None."""
        now = time.monotonic()
        with self._lock:
            previous = self._seen.pop(key_id, None)
            pending = 1 if previous is None else previous[1] + 1
            due = previous is None or now - previous[0] >= self._window
            self._seen[key_id] = (now, 0) if previous is None or due else (previous[0], pending)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
        return pending if due else None


class _LogRevocations:
    """What the signed audit log says about keys, kept in memory: the key ids it revoked,
    the index of each key's ``key_created`` and of each tenant's latest ``tenant_erased``.

    Why in memory: authentication is on every request, so it costs a set and two dict
    lookups; the log is read once (one scan of its bodies in the database), then only its
    entries past the last one read, at most every ``refresh_s``, or at once when a key's
    tenant was erased and its creation is not known yet (created by another process since).
    Entries are matched and parsed from their hashed bodies, never by the ``type`` column
    (which nothing hashes: a writer could hide a revocation by renaming it there)."""

    def __init__(self, engine: Engine, refresh_s: float = REFRESH_S) -> None:
        self._engine, self._refresh_s = engine, refresh_s
        self._lock = threading.Lock()  # guards the sets below (held for lookups, never across a query)
        self._reading = threading.Lock()  # one reader of the log at a time (held across its query)
        self._log_exists = False
        self._next = 0  # the first log index not read yet
        self._read_at = -math.inf  # time.monotonic() of the last read
        self._revoked: set[str] = set()
        self._created: dict[str, int] = {}  # key id -> index of its key_created
        self._erased: dict[str, int] = {}  # tenant -> index of its latest tenant_erased

    def note_created(self, key_id: str, index: int) -> None:
        """This process logged ``key_created`` for ``key_id`` at ``index``."""
        with self._lock:
            self._created[key_id] = index

    def note_revoked(self, key_id: str) -> None:
        """This process logged ``key_revoked`` for ``key_id``."""
        with self._lock:
            self._revoked.add(key_id)

    def load(self) -> None:
        """Read the log up to its end now (the server does this at startup, so the first full
        scan is not a request's to wait for)."""
        with self._reading:
            self._read()

    def revoked(self, key_id: str, tenant: str) -> bool:
        """True when the log revokes the key (its id, or its tenant erased after its creation).
        Until the log was read once every caller waits for that read; after it, a due refresh
        is made by one caller while the others answer from what was read (at most one query
        older), so a slow query never holds up every authentication."""
        if self._read_at == -math.inf:
            with self._reading:
                if self._read_at == -math.inf:
                    self._read()
        elif time.monotonic() - self._read_at >= self._refresh_s and self._reading.acquire(blocking=False):
            try:
                self._read()
            finally:
                self._reading.release()
        with self._lock:
            says = self._says(key_id, tenant)
            known = key_id in self._revoked or key_id in self._created
        if says and not known:  # the miss path: a key created since the last read, e.g. by the CLI
            with self._reading:
                self._read()
            with self._lock:
                says = self._says(key_id, tenant)
        return says

    def _says(self, key_id: str, tenant: str) -> bool:
        if key_id in self._revoked:
            return True
        erased = self._erased.get(tenant)
        # a key the log never saw created (from before key_created existed) predates every erase it can
        # know of: refused if its tenant was erased at all (closed: its creation cannot be placed)
        return erased is not None and self._created.get(key_id, -1) < erased

    def _read(self) -> None:
        """The entries past the last one read (the caller holds ``_reading``; ``_lock`` is
        taken only to apply them)."""
        from fak.audit import AuditError, parse_event
        from fak.audit import store as log_store

        with self._engine.connect() as conn:
            if not self._log_exists:
                self._log_exists = sa.inspect(conn).has_table("audit_entries")
            if not self._log_exists:  # no log yet: nothing revoked
                self._read_at = time.monotonic()
                return
            stop = log_store.size(conn)
            rows = log_store.entries_of_types(conn, LOG_TYPES, self._next, stop) if stop > self._next else []
        events = []
        for index, body in rows:
            try:
                events.append((index, parse_event(body)))
            except AuditError:  # an edited body: the signer's alarm (history rewritten), not ours
                continue
        with self._lock:
            for index, event in events:
                if event.type == "key_revoked":
                    self._revoked.add(event.key_id)
                elif event.type == "key_created":
                    self._created[event.key_id] = index
                elif event.type == "tenant_erased":
                    self._erased[event.tenant] = index
        self._next = max(self._next, stop)
        self._read_at = time.monotonic()


def _lifetime_us(expires_in: float | timedelta) -> int:
    seconds = expires_in.total_seconds() if isinstance(expires_in, timedelta) else expires_in
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
            or not 0 < seconds <= MAX_LIFETIME_S:
        raise InvalidInput(f"a key's expiry must be a positive number of seconds up to {MAX_LIFETIME_S} "
                           f"(100 years), not {expires_in!r}")
    return max(1, int(seconds * 1_000_000))


class KeyStore:
    def __init__(self, engine: Engine, hash_key: bytes, mac_key: bytes, audit: AuditSink | None = None, *,
                 alarm_window_s: float = ALARM_WINDOW_S) -> None:
        """``hash_key``, ``mac_key``: derived from the master secret under ``HASH_LABEL`` and
        ``MAC_LABEL`` (never the secret itself). ``audit``: where creations, revocations and
        alarms are logged; without it keys can be checked and listed but not created or revoked."""
        self._hash_key, self._mac_key, self._audit = hash_key, mac_key, audit
        self._alarms = _AlarmWindow(alarm_window_s)
        self._log_says = _LogRevocations(engine)
        self._session = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(engine.execution_options(**{WRITE: True}), expire_on_commit=False)

    @classmethod
    def of(cls, kernel: Kernel) -> KeyStore:
        """The key store of a kernel's deployment: its database, keys from its master secret, its log."""
        store = cls(kernel.state.engine, kernel.derive_key(HASH_LABEL), kernel.derive_key(MAC_LABEL), kernel.audit)
        store.load_log()  # the first full scan of the log at startup, not on a request
        return store

    def load_log(self) -> None:
        """Read what the audit log says about keys now (else the first check reads it)."""
        self._log_says.load()

    def _hash(self, key: str) -> str:
        return hmac.new(self._hash_key, key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def _log(self, event: object) -> int:
        if self._audit is None:
            raise FakError("API key changes are audited: open the key store with the deployment's audit log")
        return self._audit.append(event)

    def create(self, tenant: str, role: str, name: str | None = None, *, expires_in: float | timedelta | None = None,
               principal: str | None = None) -> tuple[str, Principal]:
        """A new key; the returned string is the only time it exists outside the caller.
        ``expires_in``: seconds (or a timedelta) until it is refused. Logged (``key_created``)
        before the row is written."""
        from fak.audit import KeyCreated

        tenant = check_tenant(tenant)
        try:
            role = Role(role)
        except ValueError:
            raise InvalidInput(f"role must be one of {', '.join(r.value for r in Role)}, not {role!r}") from None
        who = check_id(principal) if principal is not None else None
        created = now_us()
        expires_us = None if expires_in is None else created + _lifetime_us(expires_in)
        key_id = secrets.token_hex(8)
        key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        row = ApiKeyRow(key_id=key_id, tenant=tenant, role=role.value, hash=self._hash(key),
                        name=(name or "")[:128] or None, created_us=created, revoked_us=None, expires_us=expires_us)
        row.mac = row_mac(self._mac_key, row)
        index = self._log(KeyCreated(tenant=tenant, key_id=key_id, role=role.value, principal=who,
                                     expires_ms=None if expires_us is None else expires_us // 1000))
        self._log_says.note_created(key_id, index)
        with self._writer() as s, s.begin():
            s.add(row)
        return key, Principal(key_id, tenant, role, expires_us)

    def revoke(self, key_id: str, *, principal: str | None = None) -> None:
        """Revoke a key (idempotent); logged (``key_revoked``) before the row changes. A row
        that failed its MAC is revoked too, logged under the system tenant without a role
        (what it says about itself is not to be believed)."""
        from fak.audit import KeyRevoked

        who = check_id(principal) if principal is not None else None
        with self._session() as s:
            row = s.get(ApiKeyRow, key_id)
        if row is None:
            raise NotFound(f"no key {key_id!r}")
        if row.revoked_us is not None:
            return
        trusted = intact(self._mac_key, row, row.mac)
        self._log(KeyRevoked(tenant=row.tenant if trusted else "", key_id=row.key_id,
                             role=row.role if trusted else None, principal=who,
                             expires_ms=None if row.expires_us is None or not trusted else row.expires_us // 1000))
        self._log_says.note_revoked(row.key_id)
        with self._writer() as s, s.begin():
            row = s.get(ApiKeyRow, key_id)
            if row is not None and row.revoked_us is None:
                row.revoked_us = now_us()
                row.mac = row_mac(self._mac_key, row)

    def list(self, tenant: str | None = None) -> list[ApiKeyRow]:
        with self._session() as s:
            q = sa.select(ApiKeyRow).order_by(ApiKeyRow.created_us)
            if tenant is not None:
                q = q.where(ApiKeyRow.tenant == tenant)
            return list(s.scalars(q))

    def state(self, row: ApiKeyRow) -> str:
        """``tampered`` (the row fails its MAC, or says active where the log revoked the key),
        ``revoked``, ``expired`` or ``active``."""
        if not intact(self._mac_key, row, row.mac):
            return "tampered"
        if row.revoked_us is not None:
            return "revoked"
        if self._log_says.revoked(row.key_id, row.tenant):
            return "tampered"
        if row.expires_us is not None and now_us() >= row.expires_us:
            return "expired"
        return "active"

    def check(self, key: str | None) -> Check:
        if not key:
            return Check(None, "missing_key", None)
        digest = self._hash(key)
        fingerprint = "hmac-sha256:" + digest
        key_id = key[len(PREFIX):].split("_", 1)[0] if key.startswith(PREFIX) else ""
        with self._session() as s:
            row = s.get(ApiKeyRow, key_id) if len(key_id) == 16 else None
        probe = row if row is not None else _NoRow()
        hash_ok = hmac.compare_digest(probe.hash.encode(), digest.encode())
        mac_ok = intact(self._mac_key, probe, probe.mac)  # computed for every key: the same work either way
        if row is None or not hash_ok:
            return Check(None, "unknown_key", fingerprint)
        if not mac_ok:
            self._alarm(row.key_id, "row_mac_mismatch")
            return Check(None, "unknown_key", fingerprint)
        if row.revoked_us is not None:
            return Check(None, "revoked_key", fingerprint)
        if self._log_says.revoked(row.key_id, row.tenant):  # an earlier row put back (e.g. from a backup)
            self._alarm(row.key_id, "revoked_in_log")
            return Check(None, "unknown_key", fingerprint)
        if row.expires_us is not None and now_us() >= row.expires_us:
            return Check(None, "expired", fingerprint)
        return Check(Principal(row.key_id, row.tenant, Role(row.role), row.expires_us), None, fingerprint)

    def _alarm(self, key_id: str, kind: Literal["row_mac_mismatch", "revoked_in_log"]) -> None:
        """A ``key_alarm`` for a presented key whose row fails its MAC (``row_mac_mismatch``) or
        says active where the log revoked it (``revoked_in_log``), at most one per key and
        window; never blocks the request (submitted, not awaited)."""
        from fak.audit import KeyAlarm
        from fak.audit.errors import AuditError

        refusals = self._alarms.note(key_id)
        if refusals is None:
            return
        what = ("its database row fails its MAC (edited outside fak)" if kind == "row_mac_mismatch" else
                "its database row says active but the audit log revoked it (an earlier row put back)")
        print(f"fak: ALARM: API key {key_id}: {what}; refused ({refusals} refusal(s) since the last alarm for it)",
              file=sys.stderr, flush=True)
        if self._audit is not None:
            with contextlib.suppress(AuditError):  # a closing log: the key is refused all the same
                self._audit.submit(KeyAlarm(key_id=key_id, kind=kind, refusals=refusals))


@contextlib.contextmanager
def open_key_store(settings: Settings, *, audited: bool = True) -> Iterator[KeyStore]:
    """The key store of a deployment outside a server (``fak keys``, benchmarks): its database
    migrated (rows from before the MAC sealed once), keys derived from its master secret, and,
    when ``audited``, its audit log (creating and revoking keys need it)."""
    from fak.audit import AuditLog
    from fak.db import make_engine, release
    from fak.keys import derive_key, load_master_secret
    from fak.state.store import upgrade

    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    url = settings.resolved_database_url
    master = load_master_secret(settings.data_dir, settings.master_secret_hex())
    mac_key = derive_key(master, MAC_LABEL)
    engine = make_engine(url)
    try:
        upgrade(engine, mac_key)
        with contextlib.ExitStack() as stack:
            audit = (stack.enter_context(AuditLog.open(url, settings.data_dir, origin=settings.audit_origin,
                                                       witnesses=settings.audit_witnesses, settings=settings))
                     if audited else None)
            yield KeyStore(engine, derive_key(master, HASH_LABEL), mac_key, audit)
    finally:
        release(engine)  # the process's engine for this database (fak.db), shared with the audit log
