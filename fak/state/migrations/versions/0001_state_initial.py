"""Kernel state: sessions, segments, refs, forgets, API keys.

Revision ID: state_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_sessions",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("updated_us", sa.BigInteger, nullable=False),
        sa.Column("model_id", sa.String(512), nullable=False),
        sa.Column("tokenizer_id", sa.String(80), nullable=False),
        sa.Column("chunk_size", sa.Integer, nullable=False),
        sa.Column("next_segment", sa.Integer, nullable=False),
        sa.Column("fingerprint", sa.String(80), nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("approximate", sa.Boolean, nullable=False),
    )
    op.create_table(
        "fak_segments",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("ref", sa.String(80), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("rule", sa.String(128), nullable=True),
        sa.Column("policy_digest", sa.String(80), nullable=True),
        sa.Column("protected", sa.Boolean, nullable=False),
        sa.Column("chunks", sa.Text, nullable=False),
        sa.Column("ntokens", sa.Integer, nullable=False),
        sa.Column("tokens", sa.LargeBinary, nullable=True),
        sa.Column("message_role", sa.String(16), nullable=True),
        sa.Column("message_text", sa.Text, nullable=True),
        sa.Column("attention", sa.Text, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
    )
    op.create_index("ix_fak_segments_ref", "fak_segments", ["tenant", "ref"])
    op.create_table(
        "fak_refs",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("tool", sa.String(128), nullable=False),
        sa.Column("tags", sa.Text, nullable=False),
        sa.Column("admitted_us", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("policy_digest", sa.String(80), nullable=False),
        sa.Column("quarantined", sa.Boolean, nullable=False),
        sa.Column("quarantine_reason", sa.String(128), nullable=True),
    )
    op.create_table(
        "fak_forgets",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("ref", sa.String(80), nullable=False),
        sa.Column("started_us", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("principal", sa.String(128), nullable=True),
        sa.Column("reason", sa.String(128), nullable=True),
        sa.Column("requested_index", sa.BigInteger, nullable=True),
        sa.Column("completed_index", sa.BigInteger, nullable=True),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("kek_version", sa.Integer, nullable=True),
        sa.Column("units", sa.Text, nullable=False),
        sa.Column("sessions", sa.Text, nullable=False),
    )
    op.create_index("ix_fak_forgets_ref", "fak_forgets", ["tenant", "ref"])
    op.create_table(
        "fak_api_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("revoked_us", sa.BigInteger, nullable=True),
    )


def downgrade() -> None:
    for table in ("fak_api_keys", "fak_forgets", "fak_refs", "fak_segments", "fak_sessions"):
        op.drop_table(table)
