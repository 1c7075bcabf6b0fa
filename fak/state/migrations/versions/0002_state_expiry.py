"""Expiry and provenance: a ref's source URL (the tool-call authorizer judges its trust as
the gate did), a ref's lifetime (``expires_us``, and when it was executed, ``expired_us``), and a
tool segment's lifetime in model turns (``expires_turn``: the session's turn count at which it
expires).

Revision ID: state_0002
Revises: state_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0002"
down_revision = "state_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_refs") as batch:
        batch.add_column(sa.Column("expires_us", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("expired_us", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("source", sa.String(2048), nullable=True))
        batch.create_index("ix_fak_refs_expires", ["expires_us"])
    with op.batch_alter_table("fak_segments") as batch:
        batch.add_column(sa.Column("expires_turn", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.drop_column("expires_turn")
    with op.batch_alter_table("fak_refs") as batch:
        batch.drop_index("ix_fak_refs_expires")
        batch.drop_column("source")
        batch.drop_column("expired_us")
        batch.drop_column("expires_us")
