"""CAS errors. All are FakErrors so the CLI and the API show the message, not a
traceback. A tenant asking for another tenant's digest gets ``NotFound``, the
same error as for a digest nobody stored: no existence oracle across tenants."""

from __future__ import annotations

from fak.errors import FakError


class CasError(FakError):
    """Base class of every CAS error."""


class InvalidDigest(CasError, ValueError):
    """A digest string that does not follow the grammar fak accepts."""


class InvalidInput(CasError, ValueError):
    """A bad tenant, media type, taint or unit name."""


class NotFound(CasError, KeyError):
    """No such ref for this tenant (also: the ref belongs to another tenant)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class Forgotten(CasError):
    """The ref was forgotten: its key and ciphertext were destroyed."""


class IntegrityError(CasError):
    """Stored bytes do not match their digest, size or authentication tag."""


class TooLarge(CasError):
    """The blob exceeds the store's configured maximum size."""


class KeyMismatch(CasError):
    """The master secret / KEK does not match the one this store was created with."""
