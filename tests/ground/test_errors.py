"""Every FakError has a stable snake_case code (its own, unique, or its parent's) and an
HTTP-like status; ``error_codes()`` lists them; the registry refuses clashes."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

from fak import errors
from fak.errors import FakError, error_codes

PACKAGES = ("fak.cas", "fak.audit", "fak.policy")
MODULES = ("fak.kernel.model.config", "fak.errors", "fak.types", "fak.db")


def _modules():
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, name + "."):
            if ".migrations" not in info.name:
                yield importlib.import_module(info.name)
    for name in MODULES:
        yield importlib.import_module(name)


def _error_classes() -> list[type[FakError]]:
    found: dict[str, type[FakError]] = {}
    for module in _modules():
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, FakError):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[k] for k in sorted(found)]


CLASSES = _error_classes()


def test_the_walk_finds_every_layer():
    modules = {c.__module__.rsplit(".", 1)[0] for c in CLASSES} | {c.__module__ for c in CLASSES}
    for expected in ("fak.cas", "fak.audit", "fak.policy", "fak.kernel.model.config", "fak.errors"):
        assert expected in modules
    assert len(CLASSES) >= 15


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_code_and_status(cls):
    assert isinstance(cls.code, str) and re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", cls.code)
    assert isinstance(cls.status, int) and 400 <= cls.status <= 599
    if "code" not in cls.__dict__:  # inherited from the nearest ancestor that names one
        owner = next(b for b in cls.__mro__[1:] if "code" in b.__dict__)
        assert owner.code == cls.code and owner.status == cls.status
    assert error_codes()[cls.code] == cls.status
    instance = cls.__new__(cls)
    assert instance.code == cls.code  # on instances too, for the API's problem+json


def test_codes_are_unique_per_defining_class():
    owners: dict[str, type] = {}
    for cls in CLASSES:
        if "code" in cls.__dict__:
            assert cls.code not in owners, f"{cls} and {owners.get(cls.code)} both define {cls.code!r}"
            owners[cls.code] = cls
    assert set(owners) <= set(error_codes())


def test_shared_errors_and_their_layer_subclasses():
    from fak.audit.errors import AuditError, VerificationError
    from fak.audit.merkle import ProofError
    from fak.cas import CasError, Forgotten, InvalidDigest, InvalidInput, NotFound
    from fak.kernel.model.config import ModelError
    from fak.policy.errors import PolicyError

    assert error_codes() | {
        "internal": 500, "invalid_input": 400, "not_found": 404, "conflict": 409, "forbidden": 403,
        "unavailable": 503,
    } == error_codes()  # fmt: skip
    assert issubclass(InvalidInput, errors.InvalidInput) and issubclass(InvalidInput, CasError)
    assert issubclass(InvalidInput, ValueError) and InvalidInput.code == "invalid_input"
    assert issubclass(InvalidDigest, InvalidInput) and InvalidDigest.code == "invalid_digest"
    assert issubclass(NotFound, errors.NotFound) and NotFound.code == "not_found" and NotFound.status == 404
    assert not issubclass(errors.NotFound, KeyError) and not issubclass(NotFound, KeyError)
    assert str(NotFound("no ref x for tenant 'acme'")) == "no ref x for tenant 'acme'"  # not quoted
    assert (Forgotten.code, Forgotten.status) == ("forgotten", 410)
    assert (AuditError.code, VerificationError.code, ProofError.code) == (
        "audit_error", "verification_failed", "verification_failed",
    )  # fmt: skip
    assert (PolicyError.code, ModelError.code) == ("policy_invalid", "model_error")
    assert errors.error_class("not_found") is errors.NotFound


def test_registry_refuses_clashes_and_bad_codes():
    before = error_codes()
    with pytest.raises(TypeError, match="already used"):
        type("Clash", (FakError,), {"code": "not_found", "status": 404})
    with pytest.raises(TypeError, match="snake_case"):
        type("Bad", (FakError,), {"code": "Not-Found"})
    with pytest.raises(TypeError, match="HTTP status"):
        type("Bad", (FakError,), {"code": "bad_status_x", "status": "404"})
    with pytest.raises(TypeError, match="code of its own"):
        type("Quiet", (errors.NotFound,), {"status": 410})
    with pytest.raises(TypeError, match="twice"):  # the class header and its body both name it
        type("Twice", (FakError,), {"code": "twice_x"}, code="twice_x", status=400)
    with pytest.raises(TypeError, match="code of its own"):  # the header form is checked alike
        type("Quiet", (errors.NotFound,), {}, status=410)
    assert error_codes() == before


def test_the_header_form_registers_like_the_body_form(monkeypatch):
    monkeypatch.setattr(errors, "_REGISTRY", dict(errors._REGISTRY))  # the test class leaves no trace
    header = type("HeaderForm", (errors.Conflict,), {}, code="header_form_x", status=409)
    assert "code" in header.__dict__ and (header.code, header.status) == ("header_form_x", 409)
    assert errors.error_class("header_form_x") is header and error_codes()["header_form_x"] == 409
