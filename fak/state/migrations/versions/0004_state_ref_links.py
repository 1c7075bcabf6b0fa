"""Redaction links (issue 25, item 3): a REDACT admission stores two refs, the original bytes
and the redacted form that entered attention. ``fak_ref_links`` records the pair, written by
the kernel before the redacted form is stored, so a forget of either form erases both, after a
restart or a crash too. ``fak_forgets.linked`` holds the other refs one forget erases (JSON).

Revision ID: state_0004
Revises: state_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0004"
down_revision = "state_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_ref_links",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("original", sa.String(80), primary_key=True),
        sa.Column("derived", sa.String(80), primary_key=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_fak_ref_links_derived", "fak_ref_links", ["tenant", "derived"])
    with op.batch_alter_table("fak_forgets") as batch:
        batch.add_column(sa.Column("linked", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_forgets") as batch:
        batch.drop_column("linked")
    op.drop_index("ix_fak_ref_links_derived", table_name="fak_ref_links")
    op.drop_table("fak_ref_links")
