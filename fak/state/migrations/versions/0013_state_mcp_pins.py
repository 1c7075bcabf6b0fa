"""``fak_mcp_pins``: the tools of the deployment's MCP servers as an operator approved them
(docs/mcp.md, "Pinned descriptions"): one row per (server label, tool) with the digests of its
definition, who approved it and the audit entry of the approval, under a MAC. And
``fak_held_calls.executed_us``: when fak ran an approved call itself (an MCP tool), so that an
approval runs its call once, however often it is sent again.

Revision ID: state_0013
Revises: state_0012
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0013"
down_revision = "state_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_mcp_pins",
        sa.Column("label", sa.String(64), primary_key=True),
        sa.Column("tool", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("description_digest", sa.String(80), nullable=False),
        sa.Column("schema_digest", sa.String(80), nullable=False),
        sa.Column("approved_by", sa.String(256), nullable=False),
        sa.Column("audit_index", sa.BigInteger, nullable=False),
        sa.Column("approved_us", sa.BigInteger, nullable=False),
        sa.Column("mac", sa.String(80), nullable=False),
    )


    with op.batch_alter_table("fak_held_calls") as batch:
        batch.add_column(sa.Column("executed_us", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_held_calls") as batch:
        batch.drop_column("executed_us")
    op.drop_table("fak_mcp_pins")
