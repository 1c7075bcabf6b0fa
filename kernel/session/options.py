"""What a conversation's model ``Session`` (``fak.kernel.kv.session``) is built with under the
active policy: the tenant's namespaces in the shared prefix cache and PIC registry, each only
where the policy allows its reuse; and the two ways one is built, fresh or as an exact replay.

Read at every build (and the PIC binding at every lock), so a policy reload takes effect on
the next use of every session.
"""

from __future__ import annotations

from fak.kernel.kv.pic_serve import PicBinding
from fak.kernel.kv.session import PrefixBinding, Session, SessionOptions, replay
from fak.kernel.services import Services

__all__ = ["new_session", "pic_binding", "prefix_binding", "replayed", "session_options"]


def prefix_binding(services: Services, tenant: str) -> PrefixBinding | None:
    """The tenant's namespace in the prefix cache, where the active policy reuses prefixes."""
    policy = services.policy
    if services.prefix is None or not policy.spec.reuse.prefix:
        return None
    return PrefixBinding(services.prefix, services.keys.namespace(tenant),
                         priority=policy.spec.retention.cache_priority)


def pic_binding(services: Services, tenant: str) -> PicBinding | None:
    """PIC only where the active policy allows approximate reuse."""
    if not services.policy.spec.reuse.pic_approximate:
        return None
    settings = services.settings
    return PicBinding(services.pic, services.keys.namespace(tenant), recompute_first=settings.pic_recompute_first,
                      blend_fraction=settings.pic_blend_fraction)


def session_options(services: Services, tenant: str, session_id: str) -> SessionOptions:
    """What the conversation's ``Session`` is built with besides the model."""
    return SessionOptions(
        tokenizer=services.tokenizer,
        session_id=session_id,
        tenant=tenant,
        chunk_size=services.settings.chunk_size,
        protected_kinds=services.policy.spec.protected_kinds,
        prefix=prefix_binding(services, tenant),
        pic=pic_binding(services, tenant),
    )


def new_session(services: Services, tenant: str, session_id: str) -> Session:
    """An empty ``Session`` for a new conversation."""
    return Session(services.model, **session_options(services, tenant, session_id))


def replayed(services: Services, tenant: str, session_id: str, s: Session) -> Session:
    """A fresh exact session with the same ledger as ``s`` (its live segments replayed)."""
    messages = {x.id: m for x in s.ledger.live() if (m := s.message(x.id)) is not None}
    out = replay(services.model, s.ledger.segments, messages=messages,
                 **session_options(services, tenant, session_id))
    out.ledger.continue_from(s.ledger.next_number)
    return out
