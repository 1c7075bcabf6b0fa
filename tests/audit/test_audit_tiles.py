"""The audit log as C2SP tlog-tiles (audit/tiles.py, api/routes/tiles.py, ``fak audit verify
--tiles``): the spec's path encoding and tile counts, tile bytes against a recomputation from
the leaves that shares no code with audit/tiles.py, and the routes over a real server (auth,
the public setting, cache headers, bad paths) with the CLI verifying what they serve."""

from __future__ import annotations

import hashlib

import pytest

from fak.audit import AuditLog, PolicyLoaded, merkle, note
from fak.audit import tiles as t
from fak.audit.checkpoint import sign_checkpoint
from fak.audit.cosignature import CosignerKey, add_lines, cosign
from fak.audit.signing import KEY_FILE
from fak.audit.verify import WitnessPolicy
from fak.cli import main

P = "sha256:" + "ab" * 32


# --- path grammar: the spec's examples and golang.org/x/mod/sumdb/tlog's tile paths ----------
@pytest.mark.parametrize(("n", "enc"), [(0, "000"), (7, "007"), (999, "999"), (1000, "x001/000"),
                                        (1234067, "x001/x234/067"), (1_000_000, "x001/x000/000")])
def test_index_encoding(n: int, enc: str) -> None:
    assert t.format_index(n) == enc
    assert t.parse_index(enc.split("/")) == n


@pytest.mark.parametrize(("path", "tile"), [
    ("tile/0/x001/x234/067", t.Tile(0, 1234067)),
    ("tile/1/000.p/17", t.Tile(1, 0, 17)),
    ("tile/2/000.p/1", t.Tile(2, 0, 1)),
    ("tile/63/005", t.Tile(63, 5)),
    ("tile/entries/x001/234.p/255", t.Tile(None, 1234, 255)),
    ("/tile/entries/000", t.Tile(None, 0)),
])
def test_paths_parse_and_format(path: str, tile: t.Tile) -> None:
    assert t.parse_path(path) == tile
    assert "/" + tile.path() == "/" + path.lstrip("/")


@pytest.mark.parametrize("path", [
    "tile/00/000", "tile/64/000", "tile/-1/000", "tile/a/000", "tile/0/0", "tile/0/1234", "tile/0/x001",
    "tile/0/001/234", "tile/0/x000/001", "tile/0/000.p/0", "tile/0/000.p/256", "tile/0/000.p/01",
    "tile/0/000.p/", "tile/0", "tiles/0/000", "tile/entries/x1/000", "tile/0/000.p/1/2", "",
])
def test_bad_paths_are_refused(path: str) -> None:
    with pytest.raises(t.TilePathError):
        t.parse_path(path)


def test_tiles_for_the_specs_sizes() -> None:
    paths = [x.path() for x in t.tiles_for_size(70_000)]
    assert len(paths) == 273 + 4 and paths[:2] == ["tile/0/000", "tile/0/001"]
    assert paths[-4:] == ["tile/0/273.p/112", "tile/1/000", "tile/1/001.p/17", "tile/2/000.p/1"]
    assert [x.path() for x in t.tiles_for_size(256)] == ["tile/0/000", "tile/1/000.p/1"]
    assert t.tiles_for_size(0) == [] and t.bundles_for_size(0) == []
    assert [x.path() for x in t.bundles_for_size(513)] == ["tile/entries/000", "tile/entries/001",
                                                             "tile/entries/002.p/1"]


# --- tile bytes: an independent recomputation from the leaves -----------------------------
def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 MTH, straight from its definition (no shared code with audit/tiles.py)."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def _level_hashes(leaves: list[bytes], level: int) -> list[bytes]:
    """The hashes at tree level ``level`` whose subtrees are complete: what tlog's tiles hold."""
    span = 1 << level
    if level == 0:
        return [hashlib.sha256(b"\x00" + x).digest() for x in leaves]
    below = _level_hashes(leaves, level - 1)
    return [hashlib.sha256(b"\x01" + below[i] + below[i + 1]).digest() for i in range(0, len(below) - 1, 2)][
        : len(leaves) // span]


def test_tile_bytes_equal_an_independent_recomputation() -> None:
    leaves = [f"entry {i}".encode() for i in range(256 * 256 + 300)]  # a full level-1 tile and partial edges
    tree = merkle.MemoryTree()
    for x in leaves:
        tree.append(x)
    size = len(leaves)
    rows = {8 * lv: _level_hashes(leaves, 8 * lv) for lv in (0, 1, 2)}
    seen = 0
    for tile in t.tiles_for_size(size):
        if tile.level == 0 and 3 <= tile.index < 250:
            continue  # the middle of level 0 says nothing the edges do not
        got = t.tile_bytes(tile, size, tree.get)
        row = rows[8 * tile.level]  # type: ignore[operator]
        assert got == b"".join(row[tile.index * 256 : tile.index * 256 + tile.width]), tile
        seen += 1
    assert seen > 5
    # the tiles of a smaller tree (an older checkpoint): its partial tiles, same hashes
    assert t.tile_bytes(t.Tile(0, 1, 44), 300, tree.get) == b"".join(rows[0][256:300])
    with pytest.raises(t.TileNotFound):
        t.tile_bytes(t.Tile(0, 1, 45), 300, tree.get)
    # a tiles client recomputes every root and proof from the tiles alone
    served = {x.path(): t.tile_bytes(x, size, tree.get) for x in t.tiles_for_size(size)}
    reader = t.TileReader(size, served.__getitem__)
    assert merkle.root_from(size, reader.get) == _mth(leaves)
    for index in (0, 255, 256, 65535, 65536, size - 1):
        proof = merkle.inclusion_proof(index, size, reader.get)
        merkle.verify_inclusion(index, size, merkle.hash_leaf(leaves[index]), proof, _mth(leaves))
    for old in (1, 256, 1000, 65536):
        proof = merkle.consistency_proof(old, size, reader.get)
        merkle.verify_consistency(old, size, _mth(leaves[:old]), _mth(leaves), proof)


def test_entry_bundle_round_trip() -> None:
    entries = [b"", b"x", b"\x00" * 300, bytes(range(256)) * 255]
    data = t.bundle_bytes(entries)
    assert data[:2] == b"\x00\x00" and data[2:5] == b"\x00\x01x"
    assert t.parse_bundle(data, 4) == entries
    with pytest.raises(Exception, match="not 3"):
        t.parse_bundle(data, 3)
    with pytest.raises(Exception, match="inside"):
        t.parse_bundle(data[:-1])
    with pytest.raises(Exception, match="does not fit"):
        t.bundle_bytes([b"x" * 65536])


def test_verify_tiles_over_a_log(tmp_path) -> None:
    d = tmp_path / "log"
    with AuditLog.open(url=f"sqlite:///{d / 'fak.db'}", data_dir=d, checkpoint_every=100) as log:
        for i in range(300):
            log.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant=f"t{i % 3}"))
        first = log.checkpoint()
        for i in range(300, 530):
            log.append(PolicyLoaded(policy_id=f"p{i}", policy_digest=P))
        cp = log.checkpoint()
        bodies = [e.body for e in log.entries()]
        with log.read_snapshot() as conn:
            from fak.audit import store

            def fetch(path: str) -> bytes:
                if path == "checkpoint":
                    return cp.note.encode()
                tile = t.parse_path(path)
                t.check_served(tile, cp.size)
                if tile.entries:
                    return t.bundle_bytes(bodies[tile.index * 256 : tile.index * 256 + tile.width])
                return t.tile_bytes(tile, cp.size, lambda ids: store.get_nodes(conn, ids))

            key = log.public_key()
            good = t.verify_tiles(fetch, key, since=first.note, entries=[0, 299, 300, 529])
            assert good.ok, good.failure
            assert good.size == 530 and good.root == cp.root

            def tampered(path: str) -> bytes:
                data = fetch(path)
                return data[:-1] + bytes([data[-1] ^ 1]) if path == "tile/0/002.p/18" else data

            bad = t.verify_tiles(tampered, key)
            assert not bad.ok and "root" in (bad.failure or "")
            wrong = t.verify_tiles(fetch, note.Signer.generate(cp.origin).verifier().vkey())
            assert not wrong.ok and (bad.failure or "").startswith("tree root")
            assert (wrong.failure or "").startswith("checkpoint signature")
            signer = note.Signer.parse((d / KEY_FILE).read_text().strip())
            fork = sign_checkpoint(signer, cp.origin, 400, hashlib.sha256(b"fork").digest())
            forked = t.verify_tiles(fetch, key, since=fork.note)
            assert not forked.ok and (forked.failure or "").startswith("consistency"), forked.failure
            assert not t.verify_tiles(fetch, key, entries=[530]).ok
            assert t.verify_tiles(fetch, key, max_age=3600).ok
            stale = t.verify_tiles(fetch, key, max_age=-1)
            assert not stale.ok and (stale.failure or "").startswith("checkpoint age")

            def lying(path: str) -> bytes:  # an entry bundle whose entry 260 was rewritten
                data = fetch(path)
                if path != "tile/entries/001":
                    return data
                entries = t.parse_bundle(data)
                entries[4] = entries[4].replace(b'"p260"', b'"p999"')
                return t.bundle_bytes(entries)

            lied = t.verify_tiles(lying, key, entries=[259, 260])
            assert not lied.ok and (lied.failure or "").startswith("inclusion of entry 260"), lied.failure
            # witnesses: a quorum the served checkpoint meets, and one it does not
            w = CosignerKey.generate("witness.example/w1")
            cosigned = add_lines(cp.note, [cosign(w, cp.text, 1_700_000_000)])

            def witnessed(path: str) -> bytes:
                return cosigned.encode() if path == "checkpoint" else fetch(path)

            policy = WitnessPolicy.from_keys([w.vkey()], 1)
            assert t.verify_tiles(witnessed, key, witnesses=policy).ok
            short = t.verify_tiles(fetch, key, witnesses=policy)
            assert not short.ok and (short.failure or "").startswith("witness quorum: 0 of 1"), short.failure


# --- the routes over a real server ----------------------------------------------------------
@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"operator_tenant": "acme"})


def _grow(live, n: int) -> None:  # noqa: ANN001
    futures = [live.kernel.audit.submit(PolicyLoaded(policy_id=f"p{i}", policy_digest=P, tenant="evil"))
               for i in range(n)]
    for f in futures:
        f.result(timeout=60)
    live.kernel.audit.checkpoint()


def test_tile_routes_auth_caching_and_bad_paths(live_server, monkeypatch) -> None:
    live = live_server
    _grow(live, 300)
    size = live.kernel.audit.latest_checkpoint().size
    assert size >= 300
    base = "/v1/audit/log"
    with live.client() as anon, live.client(live.key("acme", "auditor")) as op, \
            live.client(live.key("evil", "auditor")) as other, live.client(live.key("acme", "agent")) as agent:
        for path in ("checkpoint", "tile/0/000", "tile/entries/000"):
            assert anon.get(f"{base}/{path}").status_code == 401
            assert agent.get(f"{base}/{path}").status_code == 403
        r = op.get(f"{base}/checkpoint")
        assert r.status_code == 200 and r.headers["content-type"] == "text/plain; charset=utf-8"
        assert r.headers["cache-control"] == "private, max-age=5"
        assert r.text == live.kernel.audit.latest_checkpoint().note
        for path in ("checkpoint", "tile/0/000", "tile/entries/000"):  # another tenant: nothing by default
            r = other.get(f"{base}/{path}")
            assert r.status_code == 403 and "operator tenant" in r.json()["detail"], (path, r.text)
        full = op.get(f"{base}/tile/0/000")  # a level-0 tile: every entry's leaf hash
        assert full.status_code == 200 and len(full.content) == 8192
        assert full.headers["content-type"] == "application/octet-stream"
        assert full.headers["cache-control"] == "private, max-age=31536000, immutable"
        leaves = [e.body for e in live.kernel.audit.entries(None, 0, 256)]
        assert full.content == b"".join(hashlib.sha256(b"\x00" + x).digest() for x in leaves)
        w = size - 256 if size < 512 else 1
        part = op.get(f"{base}/tile/0/001.p/{w}")
        assert part.status_code == 200 and len(part.content) == 32 * w
        assert part.headers["cache-control"] == "private, max-age=60"
        every = live.kernel.settings.model_copy(update={"audit_tiles_tenants": "all"})
        monkeypatch.setattr(live.kernel, "settings", every)  # hash tiles and checkpoint for every tenant's auditors
        assert other.get(f"{base}/tile/0/000").content == full.content
        assert other.get(f"{base}/checkpoint").status_code == 200
        assert other.get(f"{base}/tile/entries/000").status_code == 403  # bundles: the operator tenant's only
        bundle = op.get(f"{base}/tile/entries/000")
        assert bundle.status_code == 200 and t.parse_bundle(bundle.content, 256) == leaves
        assert bundle.headers["cache-control"] == "private, max-age=31536000, immutable"
        for bad in ("tile/00/000", "tile/0/1", "tile/0/000.p/0", "tile/0/000.p/256", "tile/x/000", "tile/0"):
            r = op.get(f"{base}/{bad}")
            assert r.status_code == 400 and r.headers["content-type"].startswith("application/problem+json"), bad
        assert op.get(f"{base}/tile/0/x001/000").status_code == 404  # beyond the signed tree
        grown = live.kernel.audit.latest_checkpoint().size  # the requests above log (denials) and sign anew
        if grown < 511:  # a width one past the signed tree's (read now, not at the start: the tree grows)
            assert op.get(f"{base}/tile/0/001.p/{grown - 255}").status_code == 404
        assert op.get(f"{base}/tile/5/000.p/1").status_code == 404
        monkeypatch.setattr(live.kernel, "settings", live.kernel.settings.model_copy(update={"audit_tiles_public": True}))
        pub = anon.get(f"{base}/tile/entries/000")
        assert pub.status_code == 200 and pub.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert anon.get(f"{base}/checkpoint").headers["cache-control"] == "public, max-age=5"


def test_fak_audit_verify_tiles_cli(live_server, tmp_path, capsys, monkeypatch) -> None:
    live = live_server
    _grow(live, 280)
    prefix = live.url + "/v1/audit/log"
    key, pub = live.key("acme", "auditor"), live.kernel.audit.public_key()
    seen = tmp_path / "last.checkpoint"
    args = ["audit", "verify", "--tiles", prefix, "--key", key, "--since-checkpoint", str(seen)]
    assert main([*args, "--pubkey", pub, "--entry", "0", "--entry", "260"]) == 0
    out = capsys.readouterr()
    assert "tiles OK" in out.out and "2 entries included" in out.out
    first = seen.read_text()
    assert first == live.kernel.audit.latest_checkpoint().note
    _grow(live, 20)
    assert main([*args, "--pubkey", pub]) == 0  # consistent with the one it saw
    assert "consistent with the last seen checkpoint" in capsys.readouterr().out
    assert seen.read_text() != first
    # no pinned key: refused; a wrong key: the signature fails
    assert main(["audit", "verify", "--tiles", prefix, "--key", key]) == 1
    assert "pinned log key is required" in capsys.readouterr().err
    other = note.Signer.generate(live.kernel.audit.latest_checkpoint().origin).verifier().vkey()
    assert main([*args, "--pubkey", other]) == 1
    assert "checkpoint signature" in capsys.readouterr().err
    # a forked history the auditor saw before: not consistent
    signer = note.Signer.parse((live.kernel.settings.data_dir / KEY_FILE).read_text().strip())
    cp = live.kernel.audit.latest_checkpoint()
    seen.write_text(sign_checkpoint(signer, cp.origin, cp.size - 5, hashlib.sha256(b"fork").digest()).note)
    assert main([*args, "--pubkey", pub]) == 1
    assert "consistency with the last seen checkpoint" in capsys.readouterr().err
    # an auditor of another tenant: nothing by default (audit_tiles_tenants: operator); with
    # audit_tiles_tenants: all, hash tiles yes, entry bundles no (named in the error)
    evil = live.key("evil", "auditor")
    assert main(["audit", "verify", "--tiles", prefix, "--key", evil, "--pubkey", pub]) == 1
    assert "HTTP 403" in capsys.readouterr().err
    monkeypatch.setattr(live.kernel, "settings", live.kernel.settings.model_copy(update={"audit_tiles_tenants": "all"}))
    assert main(["audit", "verify", "--tiles", prefix, "--key", evil, "--pubkey", pub]) == 0
    assert main(["audit", "verify", "--tiles", prefix, "--key", evil, "--pubkey", pub, "--entry", "1"]) == 1
    assert "HTTP 403" in capsys.readouterr().err
