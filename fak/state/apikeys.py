"""The MAC that binds an API key's row: key id, tenant, role, keyed hash, revocation and
expiry, under a key derived from the master secret (never stored in the database).

Why: the keyed hash proves who holds a key, not what the row says about it. Without a MAC
anyone who can write the database (a stolen backup restored, a compromised replica, a
shell on the database host) moves a key to another tenant, makes an agent key an admin
key or un-revokes a key, and the server honours it. With it, an edited row fails its
MAC and the key is refused. What the MAC cannot stop: deleting a row (the key is then
refused too) and replaying a whole earlier row of the same key (e.g. restoring the row
as it was before a revocation); the signed audit log is the backstop for the latter
(``fak.api.keys``: a key the log revoked is refused whatever its row says), and
``docs/api.md`` says what remains.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Protocol

MAC_LABEL = "fak/api/key-row-mac"  # derive_key(master, MAC_LABEL): the row MAC key
MAC_VERSION = "v1"


class KeyRowFields(Protocol):
    """What the MAC covers (``fak.state.schema.ApiKeyRow`` has these); read-only members, so a
    frozen stand-in for a missing row fits too."""

    @property
    def key_id(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def hash(self) -> str: ...
    @property
    def revoked_us(self) -> int | None: ...
    @property
    def expires_us(self) -> int | None: ...


def row_mac(mac_key: bytes, row: KeyRowFields) -> str:
    """``v1:`` + HMAC-SHA256 over the row's bound fields in an unambiguous encoding (a JSON
    array: no field can borrow bytes from its neighbour)."""
    fields = ["fak-api-key-row", MAC_VERSION, row.key_id, row.tenant, row.role, row.hash,
              None if row.revoked_us is None else int(row.revoked_us),
              None if row.expires_us is None else int(row.expires_us)]
    msg = json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()
    return f"{MAC_VERSION}:" + hmac.new(mac_key, msg, hashlib.sha256).hexdigest()


def intact(mac_key: bytes, row: KeyRowFields, stored: str | None) -> bool:
    """True when ``stored`` is the row's MAC (compared in constant time; a missing MAC fails)."""
    return hmac.compare_digest((stored or "").encode(), row_mac(mac_key, row).encode())
