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
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fak.audit import merkle
from fak.audit.errors import AuditError

STATE_FILE = "audit_signer.state"

# Yields the stored event bytes of entries [start, stop), in index order.
BodyReader = Callable[[int, int], Iterable[bytes]]


@dataclass(frozen=True)
class SignerState:
    origin: str
    key_id: str  # the signing key's 8-hex note key id: the state belongs to that key only
    size: int
    root: bytes
    signed_at: int  # POSIX seconds

    def to_json(self) -> str:
        return json.dumps({"origin": self.origin, "key_id": self.key_id, "size": self.size,
                           "root": base64.b64encode(self.root).decode(), "signed_at": self.signed_at},
                          sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SignerState:
        try:
            obj = json.loads(text)
            root = base64.b64decode(obj["root"], validate=True)
            state = cls(str(obj["origin"]), str(obj["key_id"]), int(obj["size"]), root, int(obj["signed_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"audit signer state is unreadable: {exc}") from None
        if state.size < 0 or len(root) != merkle.HASH_SIZE:
            raise AuditError("audit signer state is malformed (size or root)")
        return state


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
    the entries appended since, so each checkpoint costs what was appended."""

    def __init__(self, path: Path, origin: str, key_id: str) -> None:
        self.path = Path(path)
        self.origin = origin
        self.key_id = key_id
        self._verified: merkle.Frontier | None = None  # entries [0, state.size) rehashed
        self._state: SignerState | None = None

    @property
    def remembered(self) -> SignerState | None:
        """The state last read or written by this process."""
        return self._state

    def _read(self) -> SignerState | None:
        state = read_state(self.path)
        if state is not None and (state.origin, state.key_id) != (self.origin, self.key_id):
            # the key was replaced: this key remembers nothing (an alarm unless the log is empty)
            print(f"fak audit: signer state {self.path} belongs to {state.origin} key {state.key_id}, not "
                  f"{self.origin} key {self.key_id}: this key remembers nothing", file=sys.stderr, flush=True)
            return None
        return state

    def _check(self, state: SignerState | None, n: int, read: BodyReader) -> merkle.Frontier:
        """The frontier at ``state.size`` recomputed from entries, or SignerRefused."""
        if state is None:
            if n == 0:
                return merkle.Frontier()
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
                                f"or the database was restored from a backup", state, n, found)
        v = self._verified
        if v is not None and state == self._state:
            f = v
        elif v is not None and state.size > v.size:
            f = frontier_from(read(v.size, state.size), v)  # another process with this key signed further
            if f.root() != state.root:  # or an operator reset another history: check it all
                f = frontier_from(read(0, state.size))
        else:
            f = frontier_from(read(0, state.size))
        if f.root() != state.root:
            raise SignerRefused("history_rewritten",
                                f"refusing to sign: the entries up to size {state.size} hash to root "
                                f"{_hex_root(f.root())}, but the signer signed root {_hex_root(state.root)} at that "
                                f"size: the database history was rewritten", state, n, f.root())
        return f

    def verify_open(self, n: int, read: BodyReader) -> None:
        """On open: create the state for an empty log, else recompute the remembered prefix
        from the entries (raises SignerRefused)."""
        with locked(self.path):
            state = self._read()
            if state is None and n == 0:
                state = SignerState(self.origin, self.key_id, 0, merkle.EMPTY_ROOT, int(time.time()))
                write_state(self.path, state)
            self._verified = self._check(state, n, read)
            self._state = state

    def extend(self, n: int, read: BodyReader) -> merkle.Frontier:
        """The tree of the first ``n`` entries, recomputed from entries, after checking that the
        remembered tree is its prefix (re-reading the state file: other processes share it)."""
        with locked(self.path):
            state = self._read()
            f = self._check(state, n, read)
            self._verified, self._state = f, state
        return frontier_from(read(f.size, n), f)

    def remember(self, size: int, frontier: merkle.Frontier, signed_at: int) -> None:
        """Record a signed checkpoint (called after it is stored, before its commit)."""
        state = SignerState(self.origin, self.key_id, size, frontier.root(), signed_at)
        with locked(self.path):
            current = self._read()
            if current is not None and current.size > size:
                return  # another process already remembers a larger (checked-consistent) tree
            write_state(self.path, state)
        self._verified, self._state = merkle.Frontier(frontier.size, list(frontier.hashes)), state

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
            f = frontier_from(read(0, size))
            if f.size != size:
                raise AuditError(f"cannot accept size {size}: the log has only {f.size} entries")
            new = SignerState(self.origin, self.key_id, size, f.root(), int(time.time()))
            write_state(self.path, new)
            self.alarm_path.unlink(missing_ok=True)
        self._verified, self._state = f, new
        return old, new
