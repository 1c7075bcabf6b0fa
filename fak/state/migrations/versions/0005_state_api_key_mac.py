"""API key rows bound by a MAC (issue 25, item 4): ``fak_api_keys.expires_us`` (a key may
expire) and ``fak_api_keys.mac`` (``fak.state.apikeys.row_mac``: key id, tenant, role, hash,
revocation and expiry under a key derived from the master secret, which is not in the
database). The rows present at the upgrade are sealed here, in the upgrade's own
transaction: they are trusted once, at upgrade, and never again. Every later row without
a valid MAC is refused. The MAC key comes from the caller (``fak.state.store.upgrade``);
a database with key rows cannot be upgraded without it.

Trusted once means once per deployment: a database writer who rolls the state schema back
(its version row, the dropped columns) must not get the rows sealed again. ``key_created``
and ``key_revoked`` exist in the audit log only once this revision has run, so when the log
(same database) holds any, the rows are left unsealed (refused, with a ``key_alarm`` when
presented) and a line says why; the operator creates new keys. The log's entries are
matched by their hashed bodies, not by their ``type`` column (which nothing hashes).

Revision ID: state_0005
Revises: state_0004
"""

import sys

import sqlalchemy as sa
from alembic import context, op

from fak.errors import FakError
from fak.state.apikeys import row_mac

revision = "state_0005"
down_revision = "state_0004"
branch_labels = None
depends_on = None

MAC_KEY = "api_key_mac"  # the alembic config attribute fak.state.store.upgrade sets


def upgrade() -> None:
    with op.batch_alter_table("fak_api_keys") as batch:
        batch.add_column(sa.Column("expires_us", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("mac", sa.String(80), nullable=True))
    keys = sa.table("fak_api_keys", sa.column("key_id"), sa.column("tenant"), sa.column("role"), sa.column("hash"),
                    sa.column("revoked_us"), sa.column("expires_us"), sa.column("mac"))
    conn = op.get_bind()
    rows = conn.execute(sa.select(keys.c.key_id, keys.c.tenant, keys.c.role, keys.c.hash, keys.c.revoked_us,
                                  keys.c.expires_us)).all()
    if not rows:
        return
    sealed_before = _first_key_event(conn)
    if sealed_before is not None:
        print(f"fak: ALARM: the API key table was rolled back to before its MAC (state_0005 ran again), but the "
              f"audit log shows this deployment sealed keys before (entry {sealed_before}): its {len(rows)} "
              f"row(s) are not sealed again and every such key is refused; create new keys (fak keys create)",
              file=sys.stderr, flush=True)
        return
    mac_key = context.config.attributes.get(MAC_KEY)
    if not isinstance(mac_key, bytes):
        raise FakError("the API key table needs sealing (state_0005) and no MAC key was given: open the "
                       "database with fak itself (fak serve, fak keys list), which derives it from the master secret")
    for row in rows:
        conn.execute(keys.update().where(keys.c.key_id == row.key_id).values(mac=row_mac(mac_key, row)))


def _first_key_event(conn: sa.Connection) -> int | None:
    """The index of the first ``key_created``/``key_revoked`` in the audit log (its body
    parsed, its type checked), or None (no log yet, or none)."""
    from fak.audit import AuditError, parse_event
    from fak.audit import store as log_store

    if not sa.inspect(conn).has_table("audit_entries"):
        return None
    for index, body in log_store.entries_of_types(conn, ("key_created", "key_revoked"), 0):
        try:
            if parse_event(body).type in ("key_created", "key_revoked"):
                return index
        except AuditError:  # an edited body: the signer's alarm; closed here too (not sealed)
            return index
    return None


def downgrade() -> None:
    with op.batch_alter_table("fak_api_keys") as batch:
        batch.drop_column("mac")
        batch.drop_column("expires_us")
