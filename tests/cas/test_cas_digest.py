"""Digest grammar, keyed digests and strict Ref parsing."""

from __future__ import annotations

from datetime import UTC, datetime

import blake3
import pytest
from pydantic import ValidationError

from fak.cas import InvalidDigest, Ref, compute, parse_digest
from fak.keys import derive_key

HEX = "ab" * 32


@pytest.mark.parametrize("good", [f"blake3:{HEX}", f"blake3k:{HEX}"])
def test_valid_digests_parse(good):
    assert parse_digest(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "blake3",
        f"blake3:{HEX[:-1]}",  # 63 hex digits
        f"blake3:{HEX}0",  # 65
        f"blake3:{HEX.upper()}",  # not canonical lowercase
        f"sha256:{HEX}",  # unsupported algorithm
        f"BLAKE3:{HEX}",  # algorithm must be lowercase (OCI grammar)
        f" blake3:{HEX}",
        f"blake3:{HEX}\n",
        f"blake3:{'g' * 64}",
        f"blake3::{HEX}",
    ],
)
def test_malformed_digests_are_clear_errors(bad):
    with pytest.raises(InvalidDigest) as info:
        parse_digest(bad)
    assert "digest" in str(info.value)


def test_non_string_digest_is_clear_error():
    with pytest.raises(InvalidDigest, match="must be a string"):
        parse_digest(b"blake3:" + HEX.encode())


def test_public_digest_is_plain_blake3():
    assert compute(b"abc") == "blake3:" + blake3.blake3(b"abc").hexdigest()


def test_keyed_digest_depends_on_tenant_key():
    master = bytes(range(32))
    k1 = derive_key(master, "fak/cas/digest-key", b"acme")
    k2 = derive_key(master, "fak/cas/digest-key", b"globex")
    d1, d2 = compute(b"same bytes", k1), compute(b"same bytes", k2)
    assert d1.startswith("blake3k:") and d2.startswith("blake3k:")
    assert d1 != d2
    assert d1.split(":")[1] != blake3.blake3(b"same bytes").hexdigest()


def _ref(**over):
    fields = dict(
        digest=f"blake3k:{HEX}", size=3, media_type="text/plain; charset=utf-8", tenant="acme",
        taint="untrusted", created_at=datetime.now(UTC),
    )  # fmt: skip
    fields.update(over)
    return Ref(**fields)


def test_ref_round_trips_through_json():
    ref = _ref()
    assert Ref.model_validate_json(ref.model_dump_json()) == ref


@pytest.mark.parametrize(
    "over",
    [
        {"digest": "blake3k:xyz"},
        {"size": -1},
        {"media_type": "not a media type"},
        {"tenant": ""},
        {"tenant": "a/b"},
        {"taint": "dirty"},
        {"state": "gone"},
    ],
)
def test_ref_rejects_bad_fields(over):
    with pytest.raises(ValidationError):
        _ref(**over)


def test_ref_rejects_unknown_fields():
    with pytest.raises(ValidationError):
        Ref.model_validate({**_ref().model_dump(), "content": "leak"})
