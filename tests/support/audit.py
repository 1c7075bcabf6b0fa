"""The attack on the audit log with write access to the database alone (no signing key): used
by the signer, unverified-log, witness and console tests."""

from __future__ import annotations

import sqlalchemy as sa

from fak.audit import merkle


def rewrite_history(url: str, index: int, new_body: bytes) -> None:
    """The attack, with write access to the database alone: drop (SQLite) or disable
    (PostgreSQL) the append-only triggers, edit one entry, recompute every stored tree
    node from the edited entries, delete the stored checkpoints (and cosignatures)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            tables = ["audit_entries", "audit_nodes", "audit_checkpoints", "audit_cosignatures"]
            if conn.dialect.name == "postgresql":
                for t in tables:
                    conn.execute(sa.text(f"ALTER TABLE {t} DISABLE TRIGGER USER"))
            else:
                names = conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars().all()
                for name in names:
                    conn.execute(sa.text(f'DROP TRIGGER "{name}"'))
            conn.execute(sa.text("UPDATE audit_entries SET body = :b WHERE idx = :i"), {"b": new_body, "i": index})
            bodies = [bytes(b) for b in conn.execute(sa.text("SELECT body FROM audit_entries ORDER BY idx")).scalars()]
            tree = merkle.MemoryTree()
            for b in bodies:
                tree.append(b)
            conn.execute(sa.text("DELETE FROM audit_nodes"))
            conn.execute(sa.text("INSERT INTO audit_nodes (node, hash) VALUES (:n, :h)"),
                         [{"n": n, "h": h} for n, h in tree.nodes.items()])
            conn.execute(sa.text("DELETE FROM audit_cosignatures"))
            conn.execute(sa.text("DELETE FROM audit_checkpoints"))
    finally:
        engine.dispose()
