"""``fak_sessions.exact_rows``: how many leading KV rows of the committed state an exact run
computes (rows PIC served or REROPE moved are approximate). A read of a session
(``GET /v1/sessions/{sid}``, the console, the SDK) answers from the durable rows alone, never
from a rebuilt KV; this is the one figure of its answer the rows did not hold. Rows written
before this revision have NULL: read as all rows when the session is not approximate, else as
none (an under-claim), until the session's next change writes it.

Revision ID: state_0012
Revises: state_0011
"""

import sqlalchemy as sa
from alembic import op

revision = "state_0012"
down_revision = "state_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("fak_sessions") as batch:
        batch.add_column(sa.Column("exact_rows", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fak_sessions") as batch:
        batch.drop_column("exact_rows")
