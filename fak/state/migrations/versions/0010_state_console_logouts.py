"""Console sign-outs (``fak.api.console.auth.Logouts``): ``fak_console_logouts`` holds the id
of each console session signed out before its cookie expired, until that expiry, so the
cookie is refused on every replica and after a restart (a cookie is otherwise valid for its
15 minutes whatever the browser did with it).

Revision ID: state_0010
Revises: state_0009
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0010"
down_revision = "state_0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fak_console_logouts",
        sa.Column("session_id", sa.String(64), primary_key=True),
        sa.Column("expires_us", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_fak_console_logouts_expires", "fak_console_logouts", ["expires_us"])


def downgrade() -> None:
    op.drop_index("ix_fak_console_logouts_expires", table_name="fak_console_logouts")
    op.drop_table("fak_console_logouts")
