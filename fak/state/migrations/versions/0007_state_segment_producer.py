"""A tool segment's producer at admission (``tool``, ``source``): tool-call authorization
judges the trust of what is in attention per segment, never per bytes (identical bytes a
trusted tool returns in another session must not launder an untrusted segment). Rows
written before this revision have NULLs and are read as unknown (untrusted): a NULL could as
well be a cleared one, and the ref's record has no MAC.
``producer_mac`` is keyed (derived from the master secret): a producer whose MAC does not
verify is read as unknown (untrusted), so writing the database cannot raise a segment's trust.

Revision ID: state_0007
Revises: state_0006
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0007"
down_revision = "state_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.add_column(sa.Column("tool", sa.String(128), nullable=True))
        batch.add_column(sa.Column("source", sa.String(2048), nullable=True))
        batch.add_column(sa.Column("producer_mac", sa.String(80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.drop_column("producer_mac")
        batch.drop_column("source")
        batch.drop_column("tool")
