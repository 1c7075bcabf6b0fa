"""One tenant grammar (fak.types.Tenant) for the CAS and the audit log: whatever the CAS
stores under, the log can record; whatever breaks the grammar is refused up front."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fak import errors, types
from fak.audit import AdmissionVerdict, AuditLog, PolicyLoaded
from fak.audit.errors import AuditError
from fak.audit.events import to_event
from fak.cas import CasStore, InvalidInput
from fak.cas.models import check_tenant
from fak.settings import StorageSettings

P = "sha256:" + "cd" * 32

# near misses: the allowed characters plus ':' (audit allowed it once), spaces, up to 130 long
near = st.from_regex(r"[A-Za-z0-9._@: -]{0,130}", fullmatch=True)


@pytest.fixture
def store(db_url):
    s = CasStore.open(StorageSettings().data_dir, db_url, chunk_size=1024)
    yield s
    s.close()


def _audit_accepts(tenant: str) -> bool:
    try:
        to_event({"type": "policy_loaded", "policy_id": "p", "policy_digest": P, "tenant": tenant})
    except AuditError:
        return False
    return True


def _cas_accepts(tenant: object) -> bool:
    try:
        check_tenant(tenant)
    except InvalidInput:
        return False
    return True


@given(st.from_regex(types.TENANT_PATTERN, fullmatch=True))
def test_every_tenant_of_the_grammar_is_accepted_everywhere(tenant):
    assert types.check_tenant(tenant) == tenant
    assert _cas_accepts(tenant)
    assert _audit_accepts(tenant)


@settings(max_examples=300)
@given(st.one_of(near, st.text(max_size=80)))
def test_cas_and_audit_agree_on_every_nonempty_tenant(tenant):
    if _cas_accepts(tenant):
        assert _audit_accepts(tenant)
    if tenant:  # "" is the audit log's system tenant, never a CAS tenant
        assert _cas_accepts(tenant) == _audit_accepts(tenant)


def test_a_100_character_tenant_is_refused_before_anything_is_stored(store):
    tenant = "t" * 100
    with pytest.raises(InvalidInput, match="100 characters, at most 64") as exc:
        store.put(b"payload", "text/plain", tenant)
    assert isinstance(exc.value, errors.InvalidInput) and exc.value.code == "invalid_input"
    assert len(str(exc.value)) < 300  # the value is cut, not echoed whole
    with pytest.raises(InvalidInput):
        store.put_stream([b"payload"], "text/plain", tenant)
    assert list(store.backend.ids()) == []
    assert list(store.backend.tmp_dir.iterdir()) == []
    assert store.tenants() == []


def test_longest_cas_tenant_round_trips_into_the_audit_log(store, tmp_path):
    tenant = "a" + "b" * (types.TENANT_MAX - 2) + "@"  # 64 characters, the longest allowed
    ref = store.put(b"payload", "text/plain", tenant)
    assert ref.tenant == tenant
    with AuditLog.open(url=f"sqlite:///{tmp_path / 'audit.db'}", data_dir=tmp_path) as log:
        i = log.append(AdmissionVerdict(session_id="s", tool="t", ref=ref.digest, size=ref.size, verdict="ALLOW",
                                        policy_digest=P, tenant=ref.tenant))  # fmt: skip
        assert log.entry(i).event.tenant == tenant
        assert [e.index for e in log.entries(tenant=tenant)] == [i]
        log.append(PolicyLoaded(policy_id="p", policy_digest=P))  # the system tenant still works
    with pytest.raises(InvalidInput):
        store.put(b"payload", "text/plain", tenant + "x")


@pytest.mark.parametrize("bad", ["", " acme", "acme:eu", "-acme", "a" * 65, "acmé", "acme\n", None, 7])
def test_bad_tenants_name_their_problem(bad):
    with pytest.raises(errors.InvalidInput, match="invalid tenant") as exc:
        types.check_tenant(bad)
    assert "expected" in str(exc.value)
