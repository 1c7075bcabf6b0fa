"""Signed notes and checkpoints: the Go sumdb/note known answer, and an independent
re-implementation of the C2SP key id and Ed25519 signature check in this test."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from fak.audit import note
from fak.audit.checkpoint import open_checkpoint, parse_body, sign_checkpoint
from fak.audit.errors import VerificationError
from fak.audit.merkle import hash_leaf

GO = json.loads((Path(__file__).parents[1] / "data" / "audit_signed_note_vectors.json").read_text())


def test_go_known_answer_sign_and_open():
    signer = note.Signer.parse(GO["skey"])
    assert signer.verifier().vkey() == GO["vkey"]
    assert note.sign(GO["text"], signer) == GO["note"]  # Ed25519 is deterministic: byte-identical
    assert note.open_note(GO["note"], note.Verifier.parse(GO["vkey"])) == GO["text"]
    with pytest.raises(VerificationError):
        note.open_note(GO["note"].replace("cryptography", "cryptographY"), note.Verifier.parse(GO["vkey"]))


def test_mangled_verifier_keys_refused():
    vkey = GO["vkey"]
    for i in range(len(vkey)):
        for repl in ("", "x", "+"):
            bad = vkey[:i] + repl + vkey[i + 1 :]
            if bad == vkey:
                continue
            with pytest.raises(VerificationError):
                note.Verifier.parse(bad)


def _independent_check(signed: str, vkey: str) -> tuple[str, int, bytes]:
    """Re-implementation from the C2SP signed-note text alone; returns (origin, size, root)."""
    name, hexid, keyb64 = vkey.split("+", 2)
    key = base64.b64decode(keyb64)
    assert key[0] == 1 and len(key) == 33
    assert hashlib.sha256(name.encode() + b"\n" + b"\x01" + key[1:]).digest()[:4] == bytes.fromhex(hexid)
    text, _, sigs = signed.rpartition("\n\n")
    text += "\n"
    verified = False
    for line in sigs.strip("\n").split("\n"):
        dash, sname, sig64 = line.split(" ")
        assert dash == "\u2014"
        raw = base64.b64decode(sig64)
        if sname == name and raw[:4] == bytes.fromhex(hexid):
            Ed25519PublicKey.from_public_bytes(key[1:]).verify(raw[4:], text.encode())  # raises if bad
            verified = True
    assert verified
    origin, size, root64, *_ = text.split("\n")
    return origin, int(size), base64.b64decode(root64)


def test_checkpoint_verifies_with_independent_implementation():
    signer = note.Signer.generate("example.test/log")
    root = hash_leaf(b"x")
    cp = sign_checkpoint(signer, "example.test/log", 42, root)
    assert _independent_check(cp.note, signer.verifier().vkey()) == ("example.test/log", 42, root)
    assert open_checkpoint(cp.note, signer.verifier(), "example.test/log").root == root
    # and our verifier accepts a checkpoint built by hand by the independent rules
    text = f"example.test/log\n7\n{base64.b64encode(root).decode()}\n"
    raw_pub = base64.b64decode(signer.verifier().vkey().split("+", 2)[2])[1:]
    kid = hashlib.sha256(b"example.test/log\n\x01" + raw_pub).digest()[:4]
    sig = signer.key.sign(text.encode())
    hand = text + "\n\u2014 example.test/log " + base64.b64encode(kid + sig).decode() + "\n"
    assert open_checkpoint(hand, signer.verifier()).size == 7


def test_unknown_signatures_ignored_known_bad_rejected():
    a, b = note.Signer.generate("a.test/log"), note.Signer.generate("b.test/log")
    signed = note.sign("a.test/log\n1\n" + note.b64(hash_leaf(b"")) + "\n", a, b)
    assert note.open_note(signed, a.verifier())  # b's signature is unknown: ignored
    with pytest.raises(VerificationError):
        note.open_note(signed, note.Signer.generate("c.test/log").verifier())
    # same name and id as a, but a signature that does not verify
    text, sigs = note.split(signed)
    forged = text + "\n\u2014 a.test/log " + note.b64(struct.pack(">I", a.id) + bytes(64)) + "\n"
    with pytest.raises(VerificationError):
        note.open_note(forged, a.verifier())


def test_non_canonical_base64_refused():
    signer = note.Signer.generate("x.test/log")
    cp = sign_checkpoint(signer, "x.test/log", 1, hash_leaf(b"a"))
    sig = cp.note.rstrip("\n").rsplit(" ", 1)[1]
    assert sig.endswith("=")  # 68 bytes: the last character carries 2 unused bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = sig[-2]
    twin = alphabet[alphabet.index(last) ^ 1]  # same decoded bytes, other padding bits
    assert base64.b64decode(sig[:-2] + twin + "=") == base64.b64decode(sig)
    with pytest.raises(VerificationError):
        open_checkpoint(cp.note.replace(sig, sig[:-2] + twin + "="), signer.verifier())


@pytest.mark.parametrize(
    "body",
    ["o\n01\n" + note.b64(bytes(32)) + "\n", "o\n1\n" + note.b64(bytes(31)) + "\n", "o\n1\n", "o\n1\nAAA\n\n"],
)
def test_malformed_checkpoint_bodies(body):
    with pytest.raises(VerificationError):
        parse_body(body)
