"""The kernel's seams: the real CAS, audit log and gate satisfy the Protocols."""

from __future__ import annotations

import inspect

from fak.audit import AuditLog
from fak.cas import CasStore
from fak.policy import gate
from fak.protocols import AuditSink, ContentStore, Gate
from fak.settings import StorageSettings


def test_real_layers_satisfy_the_protocols(tmp_path):
    url = f"sqlite:///{tmp_path / 'fak.db'}"
    with CasStore.open(StorageSettings().data_dir, url) as store, AuditLog.open(url=url, data_dir=tmp_path) as log:
        assert isinstance(store, ContentStore)
        assert isinstance(log, AuditSink)
        assert not isinstance(store, AuditSink) and not isinstance(log, ContentStore)
    assert isinstance(gate, Gate)


def test_protocol_methods_match_the_real_signatures():
    """Every parameter a Protocol method names exists on the real method, in order."""
    for proto, real in ((ContentStore, CasStore), (AuditSink, AuditLog)):
        names = [n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")]
        assert len(names) >= 7
        for name in names:
            want = list(inspect.signature(getattr(proto, name)).parameters)
            have = list(inspect.signature(getattr(real, name)).parameters)
            assert have[: len(want)] == want, (proto.__name__, name, want, have)
    want = [p for p in inspect.signature(Gate.__call__).parameters if p != "self"]
    assert list(inspect.signature(gate).parameters) == want
