"""Witnesses' cosignatures on checkpoints (C2SP tlog-cosignature), append-only like the log.

Revision ID: audit_0002
Revises: audit_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "audit_0002"
down_revision = "audit_0001"
branch_labels = None
depends_on = None

TABLE = "audit_cosignatures"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("size", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("witness", sa.String(256), primary_key=True),
        sa.Column("line", sa.Text, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":  # audit_refuse_change() exists since audit_0001
        op.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION audit_refuse_change()"
        )
        op.execute(
            f"CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change()"
        )
    else:
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {TABLE}_no_{verb.lower()} BEFORE {verb} ON {TABLE} "
                f"BEGIN SELECT RAISE(ABORT, 'audit log is append-only: {verb} on {TABLE} refused'); END"
            )


def downgrade() -> None:
    raise RuntimeError("the audit log is append-only; it is never downgraded")
