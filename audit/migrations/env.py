"""Alembic environment for the audit layer: run on the connection handed over by
fak.audit.store.migrate, with this layer's own version table."""

from alembic import context

from fak.audit.store import VERSION_TABLE, Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
