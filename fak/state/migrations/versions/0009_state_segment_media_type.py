"""A tool segment's media type at admission: it declares the structure (JSON, YAML, a mail
message) whose field paths tool-call rules may read, so it is covered by the producer MAC.
Rows written before this revision have NULL (text: no field paths), and their MAC verifies
as before (a NULL media type is not part of the MAC's message).

Revision ID: state_0009
Revises: state_0008
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0009"
down_revision = "state_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.add_column(sa.Column("media_type", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_segments") as batch:
        batch.drop_column("media_type")
