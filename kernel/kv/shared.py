"""The KV that sessions share, behind one interface: the prefix cache (exact rows, keyed by
tokens and call boundaries) and the PIC registry (position-independent chunks, approximate).

Both are per tenant namespace and both record which refs their rows attended to, so every
withdrawal of a ref (forget, late quarantine, expiry, an eviction) and a tenant's erasure is
one call here: ``drop_ref`` / ``drop_namespace`` on ``SharedKV`` (the kernel's stores, a
namespace per call) or ``drop_bound`` (a session's bindings, each with its own namespace).
What was dropped comes back as ``Dropped``: the ids a receipt or an eviction report lists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fak.kernel.kv.pic import PicRegistry
from fak.kernel.kv.pic_serve import PicBinding
from fak.kernel.kv.prefix_cache import PrefixBinding, PrefixCache


@dataclass(frozen=True)
class Dropped:
    """Shared-KV entries removed because they attended to a ref (or their namespace went)."""

    prefix_nodes: tuple[str, ...] = ()
    pic_chunks: tuple[str, ...] = ()

    def __add__(self, other: Dropped) -> Dropped:
        return Dropped(self.prefix_nodes + other.prefix_nodes, self.pic_chunks + other.pic_chunks)


class SharedKV:
    """A kernel's shared KV stores: a prefix cache (None when the settings turn it off) and a
    PIC registry (None: not kept). Namespaces are the tenant's, derived server-side."""

    def __init__(self, prefix: PrefixCache | None = None, pic: PicRegistry | None = None) -> None:
        self.prefix = prefix
        self.pic = pic

    def drop_ref(self, ns: bytes, ref: str, *, prefix: bool = True) -> Dropped:
        """Remove the entries of ``ns`` whose rows attended to ``ref``: prefix-cache nodes (with
        their subtrees), then PIC chunks. ``prefix=False``: the PIC chunks only (a forget drops
        those before it evicts the sessions, and everything after)."""
        nodes = self.prefix.drop_ref(ns, ref) if prefix and self.prefix is not None else []
        chunks = self.pic.drop_ref(ns, ref) if self.pic is not None else []
        return Dropped(tuple(nodes), tuple(chunks))

    def drop_refs(self, ns: bytes, refs: Iterable[str]) -> Dropped:
        """``drop_ref`` for each of ``refs``, in order."""
        out = Dropped()
        for ref in refs:
            out += self.drop_ref(ns, ref)
        return out

    def drop_namespace(self, ns: bytes) -> Dropped:
        """Remove everything of ``ns`` (a tenant erased)."""
        nodes = self.prefix.drop_namespace(ns) if self.prefix is not None else []
        chunks = self.pic.drop_namespace(ns) if self.pic is not None else []
        return Dropped(tuple(nodes), tuple(chunks))

    def holds_ref(self, ns: bytes, ref: str) -> bool:
        """Whether an entry of ``ns`` attended to ``ref`` (what ``drop_ref`` would remove)."""
        if self.pic is not None and self.pic.holds_ref(ns, ref):
            return True
        return self.prefix is not None and self.prefix.holds_ref(ns, ref)


def drop_bound(prefix: PrefixBinding | None, pic: PicBinding | None, refs: Iterable[str]) -> Dropped:
    """What an eviction drops from a session's bound stores: the entries, in each binding's
    namespace, that attended to ``refs`` (nobody may be served KV that attended to them)."""
    refs = list(refs)
    out = Dropped()
    if prefix is not None:
        out += SharedKV(prefix=prefix.cache).drop_refs(prefix.namespace, refs)
    if pic is not None:
        out += SharedKV(pic=pic.registry).drop_refs(pic.namespace, refs)
    return out
