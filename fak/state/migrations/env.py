"""Alembic environment of the kernel state: its own version table, so the layers share
one database. Run programmatically by ``fak.state.store.upgrade``."""

from fak.db import run_env
from fak.state.schema import Base

run_env(Base.metadata, "fak_state_alembic_version")
