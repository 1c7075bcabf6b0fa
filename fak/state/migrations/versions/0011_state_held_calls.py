"""Held tool calls and remembered approvals in the state database (issue 41.5): a restart or
another replica sees the same held calls, and an approval is honoured wherever the session
runs. ``fak_held_calls`` keeps each call the policy held for a person (CONFIRM): its
canonical form (a keyed digest of tool and arguments), its arguments sealed under the data
keys of the refs in attention when it was written, its state and who decided;
``fak_tool_approvals`` keeps the approvals a session remembers. Both carry a MAC under a key
derived from the master secret: a row written without the key is read as absent.

Revision ID: state_0011
Revises: state_0010
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0011"
down_revision = "state_0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_held_calls",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("call_id", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("form", sa.String(80), nullable=False),
        sa.Column("args_digest", sa.String(80), nullable=False),
        sa.Column("plain", sa.Text, nullable=True),
        sa.Column("sealed", sa.LargeBinary, nullable=True),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("rule_id", sa.String(128), nullable=True),
        sa.Column("offending", sa.Text, nullable=False),
        sa.Column("decision_index", sa.BigInteger, nullable=True),
        sa.Column("producer", sa.String(256), nullable=True),
        sa.Column("approval_key", sa.String(80), nullable=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("deciding", sa.String(16), nullable=True),
        sa.Column("decided_by", sa.String(256), nullable=True),
        sa.Column("approval_index", sa.BigInteger, nullable=True),
        sa.Column("mac", sa.String(80), nullable=False),
    )
    op.create_index("ix_fak_held_calls_form", "fak_held_calls", ["tenant", "form"])
    op.create_index("ix_fak_held_calls_created", "fak_held_calls", ["tenant", "state", "created_us"])
    op.create_table(
        "fak_tool_approvals",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("key", sa.String(80), primary_key=True),
        sa.Column("call_id", sa.String(64), nullable=False),
        sa.Column("approval_index", sa.BigInteger, nullable=False),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("expires_us", sa.BigInteger, nullable=False),
        sa.Column("mac", sa.String(80), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fak_tool_approvals")
    op.drop_index("ix_fak_held_calls_created", table_name="fak_held_calls")
    op.drop_index("ix_fak_held_calls_form", table_name="fak_held_calls")
    op.drop_table("fak_held_calls")
