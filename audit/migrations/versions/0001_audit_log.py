"""Audit log tables and the triggers that make them append-only.

Revision ID: audit_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "audit_0001"
down_revision = None
branch_labels = None
depends_on = None

TABLES = ("audit_entries", "audit_nodes", "audit_checkpoints")


def upgrade() -> None:
    op.create_table(
        "audit_entries",
        sa.Column("idx", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("ts", sa.BigInteger, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
    )
    op.create_index("audit_entries_tenant_idx", "audit_entries", ["tenant", "idx"])
    op.create_table(
        "audit_nodes",
        sa.Column("node", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("size", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("root", sa.LargeBinary(32), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'audit log is append-only: % on % refused', TG_OP, TG_TABLE_NAME; END $$"
        )
        for t in TABLES:
            op.execute(
                f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
                "FOR EACH ROW EXECUTE FUNCTION audit_refuse_change()"
            )
            op.execute(
                f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} "
                "FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change()"
            )
    else:
        for t in TABLES:
            for verb in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {t}_no_{verb.lower()} BEFORE {verb} ON {t} "
                    f"BEGIN SELECT RAISE(ABORT, 'audit log is append-only: {verb} on {t} refused'); END"
                )


def downgrade() -> None:
    raise RuntimeError("the audit log is append-only; it is never downgraded")
