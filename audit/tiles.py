"""The audit log as C2SP tlog-tiles: path grammar, which tiles a tree size has, a tile's
bytes from the stored subtree hashes, entry bundles, and a tiles client that verifies.

Why tiles: a standard tiles client (Go's ``golang.org/x/mod/sumdb/tlog``, Sigstore's and
static-CT tooling) verifies a log it did not write from a finite set of static, cacheable
resources. Every hash a tile holds is a complete subtree the log already stores
(``audit_nodes``): the tile at level ``L``, index ``N`` is the nodes at tree level ``8*L``
with indexes ``N*256 .. N*256+W-1``, each the MTH of ``256**L`` leaves. So serving a tile is
one batched node read, and a full tile never changes once its last leaf is in.

The client half (``TileReader``, ``verify_tiles``) uses nothing but tiles and entry bundles,
as any tiles client would: it recomputes the root of the signed checkpoint's tree from
them, builds inclusion and consistency proofs from their hashes, and checks those with
``fak.audit.merkle``; an untrusted server's tiles are trusted only through the signed root.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fak.audit import merkle
from fak.audit.checkpoint import SignedCheckpoint, open_checkpoint
from fak.audit.errors import AuditError, VerificationError
from fak.audit.merkle import HASH_SIZE, NodeGetter, node_id
from fak.audit.verify import WitnessPolicy

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT  # 256 hashes, 8,192 bytes in a full tile
MAX_LEVEL = 63  # the spec's bound on <L>
MAX_ENTRY = 0xFFFF  # an entry bundle's big-endian uint16 length prefix


class TilePathError(AuditError, ValueError):
    """A path that is not a tlog-tiles tile or entry bundle path (the route's 400)."""


class TileNotFound(AuditError, LookupError):
    """A well-formed tile or bundle the tree of the given size does not (yet) hold (404)."""


@dataclass(frozen=True)
class Tile:
    """A hash tile (``level`` 0..63) or an entry bundle (``level`` None), ``width`` 1..256
    (256: full; fewer: the partial ``.p/<W>`` right edge)."""

    level: int | None
    index: int
    width: int = TILE_WIDTH

    @property
    def partial(self) -> bool:
        return self.width < TILE_WIDTH

    @property
    def entries(self) -> bool:
        return self.level is None

    def path(self) -> str:
        """The tile's path under the log's prefix, e.g. ``tile/0/x001/x234/067.p/5``."""
        lv = "entries" if self.level is None else str(self.level)
        return f"tile/{lv}/{format_index(self.index)}" + (f".p/{self.width}" if self.partial else "")

    def span(self) -> tuple[int, int]:
        """(tree level, first node index) of its hashes: level ``8*L`` (entries: leaves)."""
        return TILE_HEIGHT * (self.level or 0), self.index * TILE_WIDTH

    def end(self) -> int:
        """How many leaves a tree needs to hold all this tile's ``width`` hashes (or entries)."""
        level, first = self.span()
        return (first + self.width) << level


# ---------------------------------------------------------------- path grammar

_LEVEL = re.compile(r"^(0|[1-9][0-9]?)$")
_WIDTH = re.compile(r"^[1-9][0-9]{0,2}$")
_ELEM = re.compile(r"^x?[0-9]{3}$")


def format_index(n: int) -> str:
    """``N`` as zero-padded 3-digit path elements, all but the last prefixed ``x``
    (1234067 -> ``x001/x234/067``)."""
    if n < 0:
        raise ValueError("a tile index is non-negative")
    parts = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        parts.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(parts))


def parse_index(elems: Sequence[str]) -> int:
    """The inverse of ``format_index`` on its path elements; TilePathError for anything else
    (a missing ``x``, an ``x`` on the last element, a leading ``x000``: one index, one path)."""
    if not elems or any(not _ELEM.match(e) for e in elems):
        raise TilePathError("a tile index is 3-digit path elements (e.g. x001/x234/067)")
    if any(not e.startswith("x") for e in elems[:-1]) or elems[-1].startswith("x"):
        raise TilePathError("every tile index element but the last starts with 'x'")
    if len(elems) > 1 and elems[0] == "x000":
        raise TilePathError("a tile index has no leading x000 element")
    n = 0
    for e in elems:
        n = n * 1000 + int(e.lstrip("x"))
    return n


def parse_path(path: str) -> Tile:
    """``tile/<L>/<N>[.p/<W>]`` or ``tile/entries/<N>[.p/<W>]`` (a leading ``/`` is allowed)."""
    parts = path.lstrip("/").split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise TilePathError("a tile path is tile/<L>/<N>[.p/<W>] or tile/entries/<N>[.p/<W>]")
    level: int | None
    if parts[1] == "entries":
        level = None
    elif _LEVEL.match(parts[1]) and int(parts[1]) <= MAX_LEVEL:
        level = int(parts[1])
    else:
        raise TilePathError(f"tile level {parts[1][:20]!r} is not 'entries' or a decimal 0..63 without leading zeros")
    elems = parts[2:]
    width = TILE_WIDTH
    if len(elems) >= 2 and elems[-2].endswith(".p"):
        w = elems[-1]
        if not _WIDTH.match(w) or int(w) >= TILE_WIDTH:
            raise TilePathError(f"partial tile width {w[:20]!r} is not a decimal 1..255 without leading zeros")
        width = int(w)
        elems = [*elems[:-2], elems[-2][:-2]]
    return Tile(level, parse_index(elems), width)


# ---------------------------------------------------------------- which tiles a tree has


def tile_for(level: int | None, index: int, size: int) -> Tile:
    """The tile (level, index) as a tree of ``size`` leaves holds it: full, or the partial
    right edge; TileNotFound when it holds none of it."""
    tree_level = TILE_HEIGHT * (level or 0)
    have = (size >> tree_level) - index * TILE_WIDTH
    if have <= 0:
        raise TileNotFound(f"a tree of size {size} has no tile {Tile(level, index).path()}")
    return Tile(level, index, min(have, TILE_WIDTH))


def tiles_for_size(size: int) -> list[Tile]:
    """Every hash tile of a tree of ``size`` (full ones, then the partial right edge), level by
    level: 70,000 leaves give 273 full level-0 tiles, a level-0 tile of width 112, a full
    level-1 tile, a level-1 tile of width 17 and a level-2 tile of width 1."""
    out: list[Tile] = []
    level = 0
    while (size >> (TILE_HEIGHT * level)) > 0:
        hashes = size >> (TILE_HEIGHT * level)
        out.extend(Tile(level, n) for n in range(hashes // TILE_WIDTH))
        if hashes % TILE_WIDTH:
            out.append(Tile(level, hashes // TILE_WIDTH, hashes % TILE_WIDTH))
        level += 1
    return out


def bundles_for_size(size: int) -> list[Tile]:
    """Every entry bundle of a tree of ``size`` (full, then the partial right edge)."""
    out = [Tile(None, n) for n in range(size // TILE_WIDTH)]
    if size % TILE_WIDTH:
        out.append(Tile(None, size // TILE_WIDTH, size % TILE_WIDTH))
    return out


def check_served(tile: Tile, size: int) -> None:
    """TileNotFound unless a tree of ``size`` holds all of ``tile``. Any width up to the tree's
    is served, so a partial tile of an older checkpoint stays available (its hashes never change)."""
    if tile.end() > size:
        raise TileNotFound(f"{tile.path()} is beyond the signed tree of size {size}")


def node_ids(tile: Tile) -> list[int]:
    """The ``audit_nodes`` ids of a hash tile's hashes, left to right."""
    level, first = tile.span()
    return [node_id(level, first + i) for i in range(tile.width)]


def tile_bytes(tile: Tile, size: int, get: NodeGetter) -> bytes:
    """A hash tile's bytes in a tree of ``size``: its ``width`` 32-byte hashes, read from the
    stored complete subtrees."""
    if tile.level is None:
        raise TilePathError("an entry bundle is not a hash tile")
    check_served(tile, size)
    ids = node_ids(tile)
    found = get(ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise AuditError(f"{len(missing)} stored subtree hashes of {tile.path()} are missing")
    return b"".join(found[i] for i in ids)


def bundle_bytes(entries: Sequence[bytes]) -> bytes:
    """Entries as a bundle: each with its big-endian uint16 length prefix."""
    out = bytearray()
    for e in entries:
        if len(e) > MAX_ENTRY:
            raise AuditError(f"an audit entry of {len(e)} bytes does not fit an entry bundle (at most {MAX_ENTRY})")
        out += len(e).to_bytes(2, "big") + e
    return bytes(out)


def parse_bundle(data: bytes, width: int | None = None) -> list[bytes]:
    """The entries of a bundle; VerificationError when it is truncated or (given ``width``)
    holds another number of entries."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise VerificationError("entry bundle ends inside a length prefix")
        n = int.from_bytes(data[pos : pos + 2], "big")
        if pos + 2 + n > len(data):
            raise VerificationError("entry bundle ends inside an entry")
        out.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    if width is not None and len(out) != width:
        raise VerificationError(f"entry bundle holds {len(out)} entries, not {width}")
    return out


def split_hashes(data: bytes, width: int) -> list[bytes]:
    """A hash tile's hashes; VerificationError unless it is exactly ``width`` hashes."""
    if len(data) != width * HASH_SIZE:
        raise VerificationError(f"tile of {len(data)} bytes is not {width} hashes")
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


# ---------------------------------------------------------------- the client: tiles only

Fetch = Callable[[str], bytes]  # a path under the log's prefix -> its bytes (raise on failure)


@dataclass
class TileReader:
    """Any complete-subtree hash of a tree of ``size``, from that tree's tiles (fetched once
    each, as Go's ``tlog.TileHashReader`` does): node (h, i) is the MTH of the ``2**(h%8)``
    hashes at indexes ``i<<(h%8)..`` of the level-``h//8`` tile row. Untrusted until a root
    computed from it matches a signed one."""

    size: int
    fetch: Fetch
    tiles: dict[Tile, list[bytes]] = field(default_factory=dict)

    def row(self, level: int, index: int) -> list[bytes]:
        tile = tile_for(level, index, self.size)
        if tile not in self.tiles:
            self.tiles[tile] = split_hashes(self.fetch(tile.path()), tile.width)
        return self.tiles[tile]

    def node(self, height: int, index: int) -> bytes:
        level, r = divmod(height, TILE_HEIGHT)
        first = index << r
        if (first + (1 << r)) << (TILE_HEIGHT * level) > self.size:
            raise AuditError(f"node ({height}, {index}) is not a complete subtree of a tree of size {self.size}")
        hashes = []
        for pos in range(first, first + (1 << r)):
            hashes.append(self.row(level, pos // TILE_WIDTH)[pos % TILE_WIDTH])
        while len(hashes) > 1:
            hashes = [merkle.hash_children(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
        return hashes[0]

    def get(self, ids: Sequence[int]) -> dict[int, bytes]:
        """A ``merkle.NodeGetter`` over the tiles."""
        mask = (1 << merkle.LEVEL_SHIFT) - 1
        return {i: self.node(i >> merkle.LEVEL_SHIFT, i & mask) for i in ids}


@dataclass
class TilesReport:
    ok: bool
    size: int = 0
    root: bytes = b""
    detail: list[str] = field(default_factory=list)
    failure: str | None = None
    checkpoint: SignedCheckpoint | None = None

    def summary(self) -> str:
        if not self.ok:
            return f"tiles FAILED: {self.failure}"
        return f"tiles OK: checkpoint of size {self.size}; " + "; ".join(self.detail)


def verify_tiles(
    fetch: Fetch,
    pubkey: str,
    *,
    witnesses: WitnessPolicy | None = None,
    since: str | None = None,
    entries: Sequence[int] = (),
    max_age: float | None = None,
    progress: bool = False,
) -> TilesReport:
    """Verify a tiled log: the checkpoint's signature under the pinned ``pubkey``, the witness
    quorum (``witnesses``: a ``fak.audit.verify.WitnessPolicy``), that the tiles hash to its
    root, consistency with ``since`` (the last checkpoint note this auditor saw), and that each
    index in ``entries`` is in the tree, its entry read from its bundle; with ``max_age``, that
    the checkpoint was signed at most that many seconds ago. Fails closed: any
    error is a failed report naming what failed."""
    from fak.audit import note

    report = TilesReport(ok=False)

    def say(msg: str) -> None:
        if progress:
            print(f"fak audit verify --tiles: {msg}", file=sys.stderr, flush=True)

    try:
        step = "checkpoint"
        say("fetching the checkpoint")
        text = fetch("checkpoint").decode("utf-8")
        step = "checkpoint signature"
        verifier = note.Verifier.parse(pubkey.strip())
        cp = open_checkpoint(text, verifier)
        report.size, report.root, report.checkpoint = cp.size, cp.root, cp
        report.detail.append(f"signed by {verifier.name}")
        if max_age is not None:
            step = "checkpoint age"
            if cp.timestamp is None:
                raise VerificationError("the checkpoint states no signing time")
            if time.time() - cp.timestamp > max_age:
                raise VerificationError(f"the checkpoint was signed {time.time() - cp.timestamp:.0f} s ago "
                                        f"(more than {max_age:g} s)")
        if witnesses is not None and witnesses.witnesses:
            step = "witness quorum"
            check = witnesses.check(text)
            if not check.ok:
                raise VerificationError(check.describe())
            report.detail.append(check.describe())
        step = "tree root from the tiles"
        say(f"recomputing the root of size {cp.size} from its tiles")
        reader = TileReader(cp.size, fetch)
        if merkle.root_from(cp.size, reader.get) != cp.root:
            raise VerificationError(f"the tiles do not hash to the checkpoint's root of size {cp.size}")
        report.detail.append(f"{len(reader.tiles)} tiles hash to its root")
        if since is not None:
            step = "consistency with the last seen checkpoint"
            old = open_checkpoint(since, verifier, cp.origin)
            say(f"checking consistency from size {old.size} to {cp.size}")
            if old.size > cp.size:
                raise VerificationError(f"the log shrank: last seen size {old.size}, now {cp.size}")
            proof = merkle.consistency_proof(old.size, cp.size, reader.get) if old.size else []
            merkle.verify_consistency(old.size, cp.size, old.root if old.size else merkle.EMPTY_ROOT, cp.root, proof)
            report.detail.append(f"consistent with the last seen checkpoint of size {old.size}")
        bundles: dict[int, list[bytes]] = {}
        for n, index in enumerate(entries):
            step = f"inclusion of entry {index}"
            if not 0 <= index < cp.size:
                raise VerificationError(f"entry {index} is outside the checkpoint's tree of size {cp.size}")
            if progress and n and n % 100 == 0:
                say(f"{n} of {len(entries)} entries checked")
            b = index // TILE_WIDTH
            if b not in bundles:
                tile = tile_for(None, b, cp.size)
                bundles[b] = parse_bundle(fetch(tile.path()), tile.width)
            leaf = merkle.hash_leaf(bundles[b][index % TILE_WIDTH])
            merkle.verify_inclusion(index, cp.size, leaf, merkle.inclusion_proof(index, cp.size, reader.get), cp.root)
        if entries:
            report.detail.append(f"{len(entries)} entries included (read from their bundles)")
    except (AuditError, ValueError, UnicodeDecodeError) as exc:
        report.failure = f"{step}: {exc}"
        return report
    report.ok = True
    return report
