"""CAS initial schema: KEK versions, wrapped data keys, refs, uses.

Revision ID: cas_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "cas_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cas_kek",
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("check_value", sa.String(64), nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("retired_us", sa.BigInteger, nullable=True),
    )
    op.create_table(
        "cas_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("kek_version", sa.Integer, nullable=False),
        sa.Column("wrapped", sa.LargeBinary(64), nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_cas_keys_kek_version", "cas_keys", ["kek_version"])
    op.create_table(
        "cas_blobs",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("media_type", sa.String(255), nullable=False),
        sa.Column("taint", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("pinned", sa.Boolean, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("forgotten_us", sa.BigInteger, nullable=True),
        sa.Column("blob_id", sa.String(32), nullable=True, unique=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("chunk_size", sa.Integer, nullable=False),
    )
    op.create_index("ix_cas_blobs_tenant_state", "cas_blobs", ["tenant", "state"])
    op.create_table(
        "cas_uses",
        sa.Column("tenant", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("unit_kind", sa.String(64), primary_key=True),
        sa.Column("unit_id", sa.String(256), primary_key=True),
        sa.Column("recorded_us", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cas_uses")
    op.drop_index("ix_cas_blobs_tenant_state", "cas_blobs")
    op.drop_table("cas_blobs")
    op.drop_index("ix_cas_keys_kek_version", "cas_keys")
    op.drop_table("cas_keys")
    op.drop_table("cas_kek")
