"""Alembic environment of the kernel state: its own version table, so the layers
share one database. Run programmatically by ``fak.state.store.upgrade``."""

from alembic import context

from fak.state.schema import Base

VERSION_TABLE = "fak_state_alembic_version"

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
