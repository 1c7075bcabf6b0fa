"""Replicated deployments (docs/scale-out.md): ``fak_sessions.replica`` names the replica a
session lives on (NULL: written by a single-process kernel, which owns every session);
``fak_replicas`` lists the replicas that ever joined, so a withdrawal knows whom it must
reach; ``fak_withdrawal_tasks`` holds one row per (withdrawal, replica): what each replica
dropped, written in the same transaction as each session it changed, so a replica killed
half way resumes where it stopped and the forget's one receipt names every replica; ``mac``
signs a finished report under a key derived from the master secret.

Revision ID: state_0008
Revises: state_0007
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0008"
down_revision = "state_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_sessions") as batch:
        batch.add_column(sa.Column("replica", sa.String(32), nullable=True))
    op.create_index("ix_fak_sessions_replica", "fak_sessions", ["replica", "tenant"])
    op.create_table(
        "fak_replicas",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("joined_us", sa.BigInteger, nullable=False),
        sa.Column("started_us", sa.BigInteger, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
    )
    op.create_table(
        "fak_withdrawal_tasks",
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("replica", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("refs", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("units", sa.Text, nullable=False),
        sa.Column("sessions", sa.Text, nullable=False),
        sa.Column("applied_by", sa.String(32), nullable=True),
        sa.Column("created_us", sa.BigInteger, nullable=False),
        sa.Column("done_us", sa.BigInteger, nullable=True),
        sa.Column("mac", sa.String(80), nullable=True),
    )
    op.create_index("ix_fak_withdrawal_tasks_pending", "fak_withdrawal_tasks", ["replica", "state"])


def downgrade() -> None:
    op.drop_index("ix_fak_withdrawal_tasks_pending", table_name="fak_withdrawal_tasks")
    op.drop_table("fak_withdrawal_tasks")
    op.drop_table("fak_replicas")
    op.drop_index("ix_fak_sessions_replica", table_name="fak_sessions")
    with op.batch_alter_table("fak_sessions") as batch:
        batch.drop_column("replica")
