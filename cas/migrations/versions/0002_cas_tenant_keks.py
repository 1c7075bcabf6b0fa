"""CAS format 2: data keys name their tenant and the random KEK that wraps them.

KEKs and digest keys move out of this database into the key database
(``cas_tenant_keys``, see ``fak.cas.keyring``). The old rows are converted by a
one-time re-wrap when a store is first opened with the master secret
(``KeyRing.migrate_legacy``): the schema change alone cannot do it, since it needs
the master secret to unwrap the RFC 3394 keys.

Revision ID: cas_0002
Revises: cas_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "cas_0002"
down_revision = "cas_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cas_keys") as batch:
        batch.add_column(sa.Column("tenant", sa.String(128), nullable=True))
        batch.add_column(sa.Column("kek_id", sa.String(32), nullable=True))
    op.create_index("ix_cas_keys_kek_id", "cas_keys", ["kek_id"])


def downgrade() -> None:
    op.drop_index("ix_cas_keys_kek_id", "cas_keys")
    with op.batch_alter_table("cas_keys") as batch:
        batch.drop_column("kek_id")
        batch.drop_column("tenant")
