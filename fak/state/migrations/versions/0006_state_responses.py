"""The OpenAI Responses door's responses (``fak.kernel.openai.responses``): ``fak_responses``
holds each stored response (its JSON body, sealed under the data keys of the refs live in
its session when it was generated, as ``fak_segments.sealed``), the persistent session its
chain lives in, the chain's instructions and the response it follows; the unique (tenant,
previous_id) index keeps a chain linear.

Revision ID: state_0006
Revises: state_0005
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0006"
down_revision = "state_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_responses",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("previous_id", sa.String(64), nullable=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("instructions", sa.Text, nullable=True),
        sa.Column("body", sa.Text, nullable=True),
        sa.Column("sealed", sa.LargeBinary, nullable=True),
        sa.Column("content", sa.Text, nullable=True),
    )
    op.create_index("ux_fak_responses_previous", "fak_responses", ["tenant", "previous_id"], unique=True)
    op.create_index("ix_fak_responses_session", "fak_responses", ["tenant", "session_id"])


def downgrade() -> None:
    op.drop_index("ix_fak_responses_session", table_name="fak_responses")
    op.drop_index("ux_fak_responses_previous", table_name="fak_responses")
    op.drop_table("fak_responses")
