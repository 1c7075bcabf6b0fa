"""Alembic environment of the CAS layer: its own version table, so the layers share
one database. Run programmatically by ``fak.cas.db.upgrade``."""

from fak.cas.schema import Base
from fak.db import run_env

run_env(Base.metadata, "fak_cas_alembic_version")
