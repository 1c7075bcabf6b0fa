"""Sealed segments (issue 25, item 2): what a ledger keeps of a segment derived from tool
content (its token ids, its message's role and text) is one AES-GCM ciphertext under a key
derived from the data keys of the refs it derives from (``fak.state.seal``); ``tokens`` and
``message_text`` stay NULL for such a segment. Rows written before are sealed on the next open.

Revision ID: state_0003
Revises: state_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0003"
down_revision = "state_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.add_column(sa.Column("sealed", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.drop_column("sealed")
