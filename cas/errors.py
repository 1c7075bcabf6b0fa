"""CAS errors. All are FakErrors so the CLI and the API show the message, not a
traceback, and each has a stable ``code`` (see ``fak.errors``). A tenant asking
for another tenant's digest gets ``NotFound``, the same error as for a digest
nobody stored: no existence oracle across tenants."""

from __future__ import annotations

from fak import errors
from fak.errors import ContentStoreError


class CasError(ContentStoreError, code="cas_error", status=500):
    """Base class of every CAS error (a ``fak.errors.ContentStoreError``, which the shared ground catches)."""


class InvalidInput(errors.InvalidInput, CasError):
    """A bad tenant, media type, taint or unit name (code ``invalid_input``)."""


class InvalidDigest(InvalidInput, code="invalid_digest", status=400):
    """A digest string that does not follow the grammar fak accepts."""


class NotFound(errors.NotFound, CasError):
    """No such ref for this tenant (also: the ref belongs to another tenant); code ``not_found``."""


class Forgotten(CasError, code="forgotten", status=410):
    """The ref was forgotten: its key and ciphertext were destroyed."""


class IntegrityError(CasError, code="integrity_error", status=500):
    """Stored bytes do not match their digest, size or authentication tag."""


class TooLarge(CasError, code="too_large", status=413):
    """The blob exceeds the store's configured maximum size."""


class KeyMismatch(CasError, code="key_mismatch", status=500):
    """The master secret / KEK does not match the one this store was created with."""


class KeyDestroyed(CasError, code="key_destroyed", status=410):
    """The KEK that wrapped this blob's data key was destroyed (rotation then
    ``destroy_retired``, or ``erase_tenant``): the blob can never be decrypted again,
    e.g. a ref of a database restored from a backup older than the destruction."""


class StorageFull(CasError, code="storage_full", status=507):
    """The blob store's disk (or quota, or file-size limit) is full: nothing was stored,
    no partial blob is visible; free space and retry."""

    public = True  # the API shows this message (it names no path or internal)
