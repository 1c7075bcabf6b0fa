"""Pinned tool descriptions (docs/mcp.md, "Pinned descriptions"): a tool of an MCP server is
offered to the model only while its name, description and input schema are what an operator
approved. The approval is logged (``McpToolsApproved``) before the pins are written; a listing
that differs from the pins (a description changed after approval: a rug pull; a tool never
approved; a name the log cannot carry) withholds those tools and is logged once per distinct
listing (``McpToolsChanged``) until an operator approves the new digests. The pins are rows of
the state database under a MAC (a row written without the key is read as unpinned), cached in
memory and read again after ``REFRESH_S`` (another replica's approval) or at once after an
approval here."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import blake3
import rfc8785

from fak.audit.events import McpToolChange, McpToolPin, McpToolsApproved, McpToolsChanged
from fak.kernel.mcp.client import McpTool
from fak.protocols import AuditSink
from fak.state.schema import McpPinRow
from fak.state.store import StateStore, now_us
from fak.types import ID_PATTERN, as_id

__all__ = ["PinCheck", "ToolPins", "Withheld"]

REFRESH_S = 2.0
_ID = re.compile(ID_PATTERN)
Change = Literal["description", "input_schema", "description_and_input_schema", "not_pinned", "invalid_name"]


def _sha(value: Any) -> str:
    return "sha256:" + hashlib.sha256(rfc8785.dumps(value)).hexdigest()


@dataclass(frozen=True)
class _Pin:
    digest: str
    description: str
    schema: str


@dataclass(frozen=True)
class Withheld:
    """A listed tool kept from the model, and why."""

    name: str
    change: Change
    pinned: str | None = None
    seen: str | None = None


@dataclass(frozen=True)
class PinCheck:
    """A server's listing against its pins: the tools that may be offered, the ones withheld."""

    offered: tuple[McpTool, ...]
    withheld: tuple[Withheld, ...]


class ToolPins:
    """The operator's approvals of MCP tool definitions, checked on every listing."""

    def __init__(self, state: StateStore, audit: AuditSink, mac_key: bytes) -> None:
        self._state, self._audit, self._key = state, audit, mac_key
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict[str, _Pin]]] = {}
        self._logged: dict[str, str] = {}  # label -> digest of the last change logged

    def _mac(self, row: McpPinRow) -> str:
        fields = ["mcp-pin/1", row.label, row.tool, row.digest, row.description_digest, row.schema_digest,
                  row.approved_by, row.audit_index, row.approved_us]
        return "blake3k:" + blake3.blake3(json.dumps(fields).encode(), key=self._key).hexdigest()

    def pins(self, label: str) -> dict[str, _Pin]:
        """Server ``label``'s pins whose MAC holds (cached ``REFRESH_S``)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(label)
            if hit is not None and now - hit[0] < REFRESH_S:
                return hit[1]
        pins = {r.tool: _Pin(r.digest, r.description_digest, r.schema_digest)
                for r in self._state.mcp_pins(label) if r.mac == self._mac(r)}
        with self._lock:
            self._cache[label] = (now, pins)
        return pins

    def approved(self, label: str) -> list[McpPinRow]:
        """Server ``label``'s pin rows whose MAC holds, read now (what an operator is shown)."""
        return [r for r in self._state.mcp_pins(label) if r.mac == self._mac(r)]

    def check(self, label: str, tools: Sequence[McpTool]) -> PinCheck:
        """Which of ``tools`` match their pins; a listing with withheld tools is logged once."""
        check = self.compare(label, tools)
        if check.withheld:
            self._log_change(label, list(check.withheld))
        return check

    def compare(self, label: str, tools: Sequence[McpTool]) -> PinCheck:
        """Which of ``tools`` match their pins, logging nothing (an operator's read)."""
        pins = self.pins(label)
        offered: list[McpTool] = []
        withheld: list[Withheld] = []
        for t in tools:
            pin = pins.get(t.name)
            if not _ID.fullmatch(t.name):
                withheld.append(Withheld(t.name[:128], "invalid_name"))
            elif pin is None:
                withheld.append(Withheld(t.name, "not_pinned", None, t.digest))
            elif pin.digest != t.digest:
                desc = _sha(t.description) != pin.description
                schema = _sha(t.input_schema) != pin.schema
                change: Change = ("description_and_input_schema" if desc and schema
                                  else "input_schema" if schema else "description")
                withheld.append(Withheld(t.name, change, pin.digest, t.digest))
            else:
                offered.append(t)
        return PinCheck(tuple(offered), tuple(withheld))

    def _log_change(self, label: str, withheld: list[Withheld]) -> None:
        key = _sha([[w.name, w.change, w.seen] for w in withheld])
        with self._lock:
            before = self._logged.get(label)
            if before == key:
                return
            self._logged[label] = key
        names = [w for w in withheld if w.change != "invalid_name"]
        try:
            self._audit.append(McpToolsChanged(server=as_id(label), changes=[
                McpToolChange(name=w.name, change=w.change, pinned=w.pinned, seen=w.seen) for w in names[:1000]]))
        except BaseException:  # not in the log: the next listing logs it (and fails again until it is)
            with self._lock:
                if self._logged.get(label) == key:
                    if before is None:
                        self._logged.pop(label, None)
                    else:
                        self._logged[label] = before
            raise

    def approve(self, label: str, tools: Sequence[McpTool], principal: str) -> int:
        """Pin ``tools`` as server ``label``'s (its earlier pins go): logged first, then written.
        Returns the approval's audit index. A tool whose name the log cannot carry is refused."""
        bad = [t.name for t in tools if not _ID.fullmatch(t.name)]
        if bad:
            raise ValueError(f"MCP server {label}: tool name {bad[0][:64]!r} is not an identifier fak can log")
        index = self._audit.append(McpToolsApproved(server=as_id(label), principal=as_id(principal), tools=[
            McpToolPin(name=t.name, digest=t.digest) for t in tools]))
        at = now_us()
        rows = []
        for t in tools:
            row = McpPinRow(label=label, tool=t.name, digest=t.digest, description_digest=_sha(t.description),
                            schema_digest=_sha(t.input_schema), approved_by=principal[:256], audit_index=index,
                            approved_us=at, mac="")
            row.mac = self._mac(row)
            rows.append(row)
        self._state.replace_mcp_pins(label, rows)
        with self._lock:
            self._cache.pop(label, None)
            self._logged.pop(label, None)
        return index
