"""Write a log export: a line-oriented file an auditor verifies offline.

Format (UTF-8, one record per line, every line ends with a newline)::

    fak-audit-export/v1 <origin> <verifier key>
    e <index> <leaf hash hex> <canonical JSON event>
    c <base64 of the signed checkpoint note, with the witnesses' cosignature lines>

A checkpoint of size N follows the entry with index N-1 (size 0: right after
the header). Lines are self-delimiting so the verifier can name the exact line
and entry index where a byte was changed. The leaf hash is the one stored when the
entry was appended, so an entry edited in the database afterwards fails at its index.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fak.audit import merkle, note, store
from fak.audit.cosignature import add_lines
from fak.audit.verify import MAGIC  # the format's first line, defined by its reader (no database)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


class Exportable(Protocol):
    """What an export reads from the log (``AuditLog`` is one): its name, its verifier key and
    one read snapshot of its database. A protocol, not ``AuditLog``, so this module does not
    import the log that calls it (``AuditLog.export``)."""

    origin: str

    def public_key(self) -> str: ...

    def read_snapshot(self) -> contextlib.AbstractContextManager[Connection]: ...


def _with_stored_leaves(conn: Connection, rows: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes, bytes]]:
    """Each entry with the leaf hash the log stored when it was appended (not one recomputed
    from the body now): a body edited in the database then fails at its own line and index."""
    it = iter(rows)
    while batch := list(itertools.islice(it, 2000)):
        stored = store.get_nodes(conn, [merkle.node_id(0, idx) for idx, _ in batch])
        for idx, body in batch:
            yield idx, body, stored.get(merkle.node_id(0, idx)) or merkle.hash_leaf(body)


def write_export(log: Exportable, path: Path) -> int:
    """Write entries [0, S) and the checkpoints up to S, S = latest checkpoint size; atomic."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with log.read_snapshot() as conn:  # one read snapshot for the whole export
        cps = [c for c in store.all_checkpoints(conn)]
        cosigs = store.all_cosignatures(conn)
        size = cps[-1][0] if cps else 0
        pending = iter(cps)
        nxt = next(pending, None)
        with open(tmp, "wb") as out:
            out.write(f"{MAGIC} {log.origin} {log.public_key()}\n".encode())
            written = 0
            rows = _with_stored_leaves(conn, store.entry_rows(conn, 0, size, None))
            while True:
                while nxt is not None and nxt[0] == written:
                    lines = cosigs.get(nxt[0])
                    served = add_lines(nxt[2], lines) if lines else nxt[2]
                    out.write(b"c " + note.b64(served.encode()).encode() + b"\n")
                    nxt = next(pending, None)
                row = next(rows, None)
                if row is None:
                    break
                idx, body, leaf = row
                out.write(b"e %d %s " % (idx, leaf.hex().encode()) + body + b"\n")
                written += 1
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)
    return written
