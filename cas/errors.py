"""CAS errors. All are FakErrors so the CLI and the API show the message, not a
traceback, and each has a stable ``code`` (see ``fak.errors``). A tenant asking
for another tenant's digest gets ``NotFound``, the same error as for a digest
nobody stored: no existence oracle across tenants."""

from __future__ import annotations

from fak import errors
from fak.errors import FakError


class CasError(FakError):
    """Base class of every CAS error."""

    code = "cas_error"
    status = 500


class InvalidInput(errors.InvalidInput, CasError):
    """A bad tenant, media type, taint or unit name (code ``invalid_input``)."""


class InvalidDigest(InvalidInput):
    """A digest string that does not follow the grammar fak accepts."""

    code = "invalid_digest"
    status = 400


class NotFound(errors.NotFound, CasError):
    """No such ref for this tenant (also: the ref belongs to another tenant); code ``not_found``."""


class Forgotten(CasError):
    """The ref was forgotten: its key and ciphertext were destroyed."""

    code = "forgotten"
    status = 410


class IntegrityError(CasError):
    """Stored bytes do not match their digest, size or authentication tag."""

    code = "integrity_error"
    status = 500


class TooLarge(CasError):
    """The blob exceeds the store's configured maximum size."""

    code = "too_large"
    status = 413


class KeyMismatch(CasError):
    """The master secret / KEK does not match the one this store was created with."""

    code = "key_mismatch"
    status = 500


class KeyDestroyed(CasError):
    """The KEK that wrapped this blob's data key was destroyed (rotation then
    ``destroy_retired``, or ``erase_tenant``): the blob can never be decrypted again,
    e.g. a ref of a database restored from a backup older than the destruction."""

    code = "key_destroyed"
    status = 410


class StorageFull(CasError):
    """The blob store's disk (or quota, or file-size limit) is full: nothing was stored,
    no partial blob is visible; free space and retry."""

    code = "storage_full"
    status = 507
    public = True  # the API shows this message (it names no path or internal)
