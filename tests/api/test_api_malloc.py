"""``fak serve`` caps glibc's malloc arenas (api/malloc.py), unless the operator set
``MALLOC_ARENA_MAX``; the effect on resident memory is measured by bench/load.py."""

from __future__ import annotations

import ctypes.util
import platform

import pytest

from fak.api.malloc import limit_arenas


def test_the_operator_s_setting_wins(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert limit_arenas() is False


@pytest.mark.skipif(platform.system() != "Linux" or not ctypes.util.find_library("c"), reason="glibc only")
def test_the_cap_is_set_where_glibc_takes_it(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_arenas() is True  # mallopt returns 1 on success
