"""Alembic environment of the CAS layer: its own version table, so several layers
share one database. Run programmatically by ``fak.cas.db.upgrade``."""

from alembic import context

from fak.cas.schema import Base

VERSION_TABLE = "fak_cas_alembic_version"

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
