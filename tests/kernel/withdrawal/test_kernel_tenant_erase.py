"""Crypto-erasing a whole tenant through the Kernel (issue 16, item 4): its sessions and KV,
its prefix-cache namespace, its keys, refs and API keys go; another tenant is untouched;
both decisions are in the log; a second call finishes what a crash left."""

from __future__ import annotations

import pytest
from support.kernel_facade_helpers import CLEAN, LOUNGE, events

from fak.cas.errors import CasError
from fak.errors import InvalidInput


def test_erase_tenant_drops_everything_of_that_tenant_only(kernel) -> None:
    from fak.api.keys import KeyStore

    k = kernel
    keys = KeyStore.of(k)
    acme_key, _ = keys.create("acme", "agent")
    other_key, _ = keys.create("globex", "agent")
    refs = []
    for _ in range(2):
        s = k.session("acme")
        s.append("system", "You are a travel assistant.")
        refs.append(s.admit("flight_status", CLEAN).ref)
        s.admit("lounge_info", LOUNGE)
    g = k.session("globex")
    g.append("system", "You are a travel assistant.")
    g_ref = g.admit("flight_status", CLEAN).ref
    g_fp = g.fingerprint()
    assert k.prefix is not None and k.prefix.nodes(k.namespace("acme"))

    with pytest.raises(InvalidInput):
        k.erase_tenant("acme", confirm="acm")  # a typo erases nothing
    assert len(k.sessions("acme")) == 2

    event = k.erase_tenant("acme", confirm="acme", requested_by="operator", reason="contract_ended")
    assert (event.sessions, event.refs_forgotten, event.api_keys_revoked) == (2, 2, 1)
    assert event.shred_status == "destroyed" and event.keys_destroyed
    assert k.sessions("acme") == [] and not k.prefix.nodes(k.namespace("acme"))
    for ref in refs:
        with pytest.raises(CasError):
            k.store.get(ref, "acme")
        assert k.state.ref("acme", ref) is None
    assert keys.check(acme_key).reason == "revoked_key" and keys.check(other_key).principal is not None
    (asked,) = events(k, "tenant_erase_requested")
    (done,) = events(k, "tenant_erased")
    assert asked.tenant == done.tenant == "acme" and asked.principal == "operator"
    assert done.requested_index < k.audit.size()

    # the other tenant: same session, same fingerprint, its bytes readable
    assert k.session("globex", g.id).fingerprint() == g_fp
    assert k.store.get(g_ref, "globex") == CLEAN

    # the tenant name can start again from nothing; a repeated erase is harmless
    fresh = k.session("acme")
    assert fresh.admit("flight_status", CLEAN).admitted
    again = k.erase_tenant("acme", confirm="acme")
    assert again.sessions == 1 and len(events(k, "tenant_erased")) == 2


def test_key_rotation_and_destruction_are_logged(kernel) -> None:
    """Rotating and destroying CAS keys are decisions: KeyRotated per tenant after the
    rotation, KeysDestroyed before the destruction; live refs stay readable."""
    k = kernel
    a = k.session("acme").admit("flight_status", CLEAN).ref
    g = k.session("globex").admit("lounge_info", LOUNGE).ref
    rotated = k.rotate_keys(principal="ops")
    assert set(rotated.versions) == {"acme", "globex"}
    rot = events(k, "key_rotated")
    assert sorted(e.tenant for e in rot) == ["acme", "globex"] and all(e.old_key_id != e.new_key_id for e in rot)
    destroyed = k.destroy_retired_keys(0, principal="ops")
    (acme_gone,) = [e for e in events(k, "keys_destroyed") if e.tenant == "acme"]
    assert acme_gone.key_ids == [next(e.old_key_id for e in rot if e.tenant == "acme")]
    assert len(destroyed.destroyed) == 2
    assert k.store.get(a, "acme") == CLEAN and k.store.get(g, "globex") == LOUNGE
