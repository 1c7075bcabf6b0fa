"""What the log's signer remembers outside the database: the last size and root it signed.

Why: whoever can write the database can drop its append-only triggers, rewrite an entry,
recompute the stored tree nodes and delete the stored checkpoints. A signer that trusted
the database would then sign the rewritten history. So the signer keeps its own record,
in a small file beside its key (``audit_signer.state``; JSON {origin, key_id, size, root,
signed_at}), written atomically (tmp, fsync, rename, fsync of the directory) after each
checkpoint is signed and stored, and before signing again it recomputes the tree *from
the entries themselves* (never from stored nodes) and checks that the remembered tree is
a prefix of it. A mismatch is refused with an ``AuditError`` naming the size and both
roots, and the refusal lasts until an operator resets the state explicitly. The refusal is
recorded beside the state (``<state>.alarm``), so every process sharing the key (a server and
a CLI on one data dir) refuses, and serves no entries or proofs, until that reset.

The state also holds each tenant's tail at the signed size (``tails``: tenant -> [its last
sequence number ``tseq``, the index of its latest entry]), taken from the entries' hashed
bodies as they are signed, never from the database's ``tenant`` column (which no hash
covers): a tenant export's signed statement states the tail the signer remembers, so rows
moved to another tenant's column are missing from the export, by number. A state written
before tails existed is upgraded once on open (one pass over the bodies, which the open
re-hashes anyway). A new entry numbered at or below its tenant's remembered tail (a writer
that counted from a changed column) is refused like a rewritten history.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from fak.audit import merkle
from fak.audit.errors import AuditError

STATE_FILE = "audit_signer.state"

# Yields the stored event bytes of entries [start, stop), in index order.
BodyReader = Callable[[int, int], Iterable[bytes]]
# tenant -> (its last sequence number, the index of its latest entry), at a tree size
Tails = Mapping[str, tuple[int, int]]
REBUILD_PROGRESS = 200_000  # entries between progress lines while tails are rebuilt on open


@dataclass(frozen=True)
class SignerState:
    origin: str
    key_id: str  # the signing key's 8-hex note key id: the state belongs to that key only
    size: int
    root: bytes
    signed_at: int  # POSIX seconds
    tails: Tails | None = None  # each tenant's tail at ``size``; None: a state from before tails

    def to_json(self) -> str:
        obj: dict[str, object] = {"origin": self.origin, "key_id": self.key_id, "size": self.size,
                     "root": base64.b64encode(self.root).decode(), "signed_at": self.signed_at}
        if self.tails is not None:
            obj["tails"] = {t: [seq, idx] for t, (seq, idx) in self.tails.items()}
        return json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SignerState:
        try:
            obj = json.loads(text)
            root = base64.b64decode(obj["root"], validate=True)
            tails = None if obj.get("tails") is None else _tails_of(obj["tails"])
            state = cls(str(obj["origin"]), str(obj["key_id"]), int(obj["size"]), root, int(obj["signed_at"]), tails)
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"audit signer state is unreadable: {exc}") from None
        if state.size < 0 or len(root) != merkle.HASH_SIZE:
            raise AuditError("audit signer state is malformed (size or root)")
        if tails is not None and any(not (seq > 0 and 0 <= idx < state.size) for seq, idx in tails.values()):
            raise AuditError("audit signer state is malformed (a tenant's tail)")
        return state


def _tails_of(obj: object) -> dict[str, tuple[int, int]]:
    if not isinstance(obj, dict):
        raise TypeError("tails is not an object")
    out = {}
    for t, v in obj.items():
        if not (isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)):
            raise TypeError(f"the tail of tenant {t!r} is not [sequence, index]")
        out[t] = (v[0], v[1])
    return out


class SignerRefused(AuditError):
    """The signer will not sign: the database disagrees with what it remembers signing."""

    code = "audit_signer_refused"

    def __init__(self, kind: str, message: str, remembered: SignerState | None, found_size: int,
                 found_root: bytes | None) -> None:
        super().__init__(message)
        self.kind = kind
        self.remembered = remembered
        self.found_size = found_size
        self.found_root = found_root


class CheckpointSuperseded(AuditError):
    """A tenant statement was asked for a checkpoint the signer has signed past since."""


def state_path(key_dir: Path, key_id: str | None = None) -> Path:
    """The default data-dir key's state is ``audit_signer.state``; a key supplied some other
    way (argument, environment) gets ``audit_signer.<key id>.state`` in the data dir, so two
    keys sharing a data dir never share a memory."""
    return Path(key_dir) / (STATE_FILE if key_id is None else f"audit_signer.{key_id}.state")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``<state>.lock``: read-check-write is atomic across
    processes sharing the key (the log's writer lock covers one database only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_state(path: Path) -> SignerState | None:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise AuditError(f"cannot read audit signer state {path}: {exc.strerror}") from None
    return SignerState.from_json(text)


def write_state(path: Path, state: SignerState) -> None:
    """Replace the state file atomically and durably (see ``atomic_write``)."""
    atomic_write(Path(path), state.to_json().encode())


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically and durably: a crash leaves the old or the new content,
    never a torn one, and a returned write survives power loss. Callers hold ``locked``."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _hex_root(root: bytes | None) -> str:
    return "none" if root is None else base64.b64encode(root).decode()


def advance(bodies: Iterable[bytes], start: merkle.Frontier, tails: dict[str, tuple[int, int]],
            strict: bool, progress: str | None = None) -> merkle.Frontier:
    """Extend (a copy of) ``start`` with ``bodies`` (the entries from index ``start.size`` on)
    and update ``tails`` (in place) from each body's own ``tenant`` and ``tseq``: an entry
    without a tseq (logged before it existed) counts one after its tenant's last. ``strict``:
    an entry numbered at or below its tenant's tail is refused (SignerRefused); otherwise the
    latest entry wins (a rebuild takes the log as it is). ``progress``: print a line to stderr
    every REBUILD_PROGRESS entries, prefixed with it."""
    f = merkle.Frontier(start.size, list(start.hashes))
    hashes, loads = f.hashes, json.loads
    for body in bodies:
        index, h = f.size, merkle.hash_leaf(body)
        try:
            obj = loads(body)
            tenant, seq = obj["tenant"], obj.get("tseq")
        except (ValueError, KeyError, TypeError):
            obj, tenant, seq = None, None, None
        if not isinstance(obj, dict) or not isinstance(tenant, str) or not (seq is None or type(seq) is int):
            raise SignerRefused("history_rewritten", f"refusing to sign: audit entry {index} is not an event "
                                "(no tenant or sequence number can be read from it)", None, index, None)
        last = tails.get(tenant)
        if seq is None:
            seq = (last[0] if last else 0) + 1
        elif strict and last is not None and seq <= last[0]:
            raise SignerRefused("tenant_sequence_repeated",
                                f"refusing to sign: audit entry {index} of tenant {tenant!r} carries sequence {seq}, "
                                f"but the signer already counted {last[0]} for that tenant (its entry {last[1]}): its "
                                "writer numbered from a changed tenant column", None, index, None)
        tails[tenant] = (seq, index)
        while index & 1:
            h = merkle.hash_children(hashes.pop(), h)
            index >>= 1
        hashes.append(h)
        f.size += 1
        if progress and f.size % REBUILD_PROGRESS == 0:
            print(f"{progress}: {f.size} entries", file=sys.stderr, flush=True)
    return f


def frontier_from(bodies: Iterable[bytes], start: merkle.Frontier | None = None) -> merkle.Frontier:
    """Extend (a copy of) ``start`` with the leaf hashes of ``bodies``."""
    f = merkle.Frontier() if start is None else merkle.Frontier(start.size, list(start.hashes))
    hashes = f.hashes
    for body in bodies:  # Frontier.append without collecting the new nodes: the hot loop
        index, h = f.size, merkle.hash_leaf(body)
        while index & 1:
            h = merkle.hash_children(hashes.pop(), h)
            index >>= 1
        hashes.append(h)
        f.size += 1
    return f


class SignerMemory:
    """The signer's remembered state plus a frontier recomputed from entries at that size.

    ``verify_open`` recomputes the whole prefix once (O(n)); afterwards ``extend`` reads only
    the entries appended since, so each checkpoint costs what was appended (and what the
    tails take to write: one pair per tenant)."""

    def __init__(self, path: Path, origin: str, key_id: str) -> None:
        self.path = Path(path)
        self.origin = origin
        self.key_id = key_id
        self._verified: merkle.Frontier | None = None  # entries [0, state.size) rehashed
        self._state: SignerState | None = None
        self._tails: Tails = {}  # the tails at self._verified.size, from the bodies (never mutated)
        self._text: str | None = None  # the state file's text last read or written, and its parse
        self._parsed: SignerState | None = None

    @property
    def remembered(self) -> SignerState | None:
        """The state last read or written by this process."""
        return self._state

    def _read(self) -> SignerState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise AuditError(f"cannot read audit signer state {self.path}: {exc.strerror}") from None
        if text != self._text:  # parsed once per change: the tails grow with the tenants
            self._parsed, self._text = SignerState.from_json(text), text
        state = self._parsed
        if state is not None and (state.origin, state.key_id) != (self.origin, self.key_id):
            # the key was replaced: this key remembers nothing (an alarm unless the log is empty)
            print(f"fak audit: signer state {self.path} belongs to {state.origin} key {state.key_id}, not "
                  f"{self.origin} key {self.key_id}: this key remembers nothing", file=sys.stderr, flush=True)
            return None
        return state

    def _check(self, state: SignerState | None, n: int, read: BodyReader) -> tuple[merkle.Frontier, Tails]:
        """The frontier at ``state.size`` recomputed from entries, with the tenants' tails there
        (rebuilt from the bodies when the state predates them), or SignerRefused."""
        if state is None:
            if n == 0:
                return merkle.Frontier(), {}
            found = frontier_from(read(0, n)).root()
            raise SignerRefused("signer_state_missing",
                                f"refusing to sign: the signer remembers nothing ({self.path} is missing) but the "
                                f"log has {n} entries (root {_hex_root(found)}); was an old key directory "
                                f"restored? Check the log, then run 'fak audit signer-reset --accept-size {n}'",
                                None, n, found)
        if state.size > n:
            found = frontier_from(read(0, n)).root()
            raise SignerRefused("signer_state_ahead",
                                f"refusing to sign: the signer signed size {state.size} (root {_hex_root(state.root)}) "
                                f"but the log has only {n} entries (root {_hex_root(found)}): entries were lost "
                                f"or the database was restored from a backup; check the log, then run 'fak audit signer-reset "
                                f"--accept-size {n}' (docs/deploy.md, 'Restore')", state, n, found)
        v, tails = self._verified, state.tails
        if v is not None and state == self._state:
            f, tails = v, self._tails
        elif v is not None and state.size > v.size and tails is not None:
            f = frontier_from(read(v.size, state.size), v)  # another process with this key signed further
            if f.root() != state.root:  # or an operator reset another history: check it all
                f = frontier_from(read(0, state.size))
        elif tails is not None:
            f = frontier_from(read(0, state.size))
        else:  # a state written before tails existed: rebuilt once, in the pass that re-hashes
            t0 = time.monotonic()
            rebuilt: dict[str, tuple[int, int]] = {}
            print(f"fak audit: signer state {self.path} has no tenant tails (written before they existed): "
                  f"rebuilding them from the bodies of {state.size} entries", file=sys.stderr, flush=True)
            f = advance(read(0, state.size), merkle.Frontier(), rebuilt, False, "fak audit: tails rebuilt")
            tails = rebuilt
            print(f"fak audit: tenant tails rebuilt ({len(rebuilt)} tenants, {state.size} entries, "
                  f"{time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)
        if f.root() != state.root:
            raise SignerRefused("history_rewritten",
                                f"refusing to sign: the entries up to size {state.size} hash to root "
                                f"{_hex_root(f.root())}, but the signer signed root {_hex_root(state.root)} at that "
                                f"size: the database history was rewritten", state, n, f.root())
        return f, tails

    def _keep(self, f: merkle.Frontier, state: SignerState, tails: Tails) -> None:
        self._verified, self._state, self._tails = f, state, tails

    def verify_open(self, n: int, read: BodyReader) -> None:
        """On open: create the state for an empty log, else recompute the remembered prefix
        from the entries (raises SignerRefused); a state without tails gets them written."""
        with locked(self.path):
            state = self._read()
            if state is None and n == 0:
                state = SignerState(self.origin, self.key_id, 0, merkle.EMPTY_ROOT, int(time.time()), {})
                write_state(self.path, state)
            f, tails = self._check(state, n, read)
            if state is not None and state.tails is None:
                state = SignerState(state.origin, state.key_id, state.size, state.root, state.signed_at, tails)
                write_state(self.path, state)
            self._keep(f, state, tails)  # type: ignore[arg-type]

    def extend(self, n: int, read: BodyReader) -> tuple[merkle.Frontier, Tails]:
        """The tree of the first ``n`` entries, recomputed from entries, after checking that the
        remembered tree is its prefix (re-reading the state file: other processes share it),
        and the tenants' tails at ``n`` from the new entries' bodies (an entry numbered at or
        below its tenant's remembered tail is refused)."""
        with locked(self.path):
            state = self._read()
            f, tails = self._check(state, n, read)
            self._keep(f, state, tails)  # type: ignore[arg-type]
        new = dict(tails)
        return advance(read(f.size, n), f, new, True), new

    def remember(self, size: int, frontier: merkle.Frontier, tails: Tails, signed_at: int) -> None:
        """Record a signed checkpoint and the tails at its size (called after it is stored,
        before its commit)."""
        state = SignerState(self.origin, self.key_id, size, frontier.root(), signed_at, dict(tails))
        text = state.to_json()
        with locked(self.path):
            current = self._read()
            if current is not None and current.size > size:
                return  # another process already remembers a larger (checked-consistent) tree
            atomic_write(self.path, text.encode())
            self._text, self._parsed = text, state  # the next read does not parse it again
        self._keep(merkle.Frontier(frontier.size, list(frontier.hashes)), state, state.tails)  # type: ignore[arg-type]

    def tails_at(self, size: int, root: bytes) -> Tails | None:
        """The tenants' tails the signer remembers at the tree (size, root): None when its
        state is at another tree (it signed since, or it remembers no tails)."""
        with locked(self.path):
            state = self._read()
        if state is None or (state.size, state.root) != (size, root):
            return None
        return state.tails

    def remembered_tail(self, tenant: str) -> int:
        """The tenant's last sequence number as this process last checked it (0: none); a
        lower bound for the next number (another process may have signed further)."""
        tail = self._tails.get(tenant)
        return 0 if tail is None else tail[0]

    @property
    def alarm_path(self) -> Path:
        return self.path.with_name(self.path.name + ".alarm")

    def record_alarm(self, exc: SignerRefused) -> None:
        """Make a refusal stand for every process sharing this key, until the operator's reset."""
        rem = exc.remembered
        data = {"kind": exc.kind, "message": str(exc), "remembered": None if rem is None else rem.to_json(),
                "found_size": exc.found_size, "found_root": _hex_root(exc.found_root)}
        with locked(self.path):
            atomic_write(self.alarm_path, (json.dumps(data, sort_keys=True) + "\n").encode())

    def standing_alarm(self) -> SignerRefused | None:
        """The refusal recorded by any process with this key and not yet reset (one stat when
        there is none); an unreadable record is itself a standing alarm."""
        try:
            text = self.alarm_path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return SignerRefused("history_rewritten", f"refusing: the signer's alarm record is unreadable "
                                 f"({exc.strerror})", None, 0, None)
        try:
            obj = json.loads(text)
            rem = None if obj["remembered"] is None else SignerState.from_json(obj["remembered"])
            root = None if obj["found_root"] == "none" else base64.b64decode(obj["found_root"], validate=True)
            return SignerRefused(str(obj["kind"]), str(obj["message"]), rem, int(obj["found_size"]), root)
        except (ValueError, KeyError, TypeError, AuditError):
            return SignerRefused("history_rewritten", "refusing: the signer's alarm record is malformed",
                                 None, 0, None)

    def reset(self, size: int, read: BodyReader) -> tuple[SignerState | None, SignerState]:
        """Operator action: accept the entries [0, size) as the new remembered tree (and lift
        the recorded alarm)."""
        with locked(self.path):
            try:
                old = self._read()
            except AuditError:
                old = None
            tails: dict[str, tuple[int, int]] = {}
            f = advance(read(0, size), merkle.Frontier(), tails, False)  # the log as it is, tails too
            if f.size != size:
                raise AuditError(f"cannot accept size {size}: the log has only {f.size} entries")
            new = SignerState(self.origin, self.key_id, size, f.root(), int(time.time()), tails)
            write_state(self.path, new)
            self.alarm_path.unlink(missing_ok=True)
        self._keep(f, new, tails)
        return old, new
