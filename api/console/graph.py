"""The provenance graph of a session as inline SVG, drawn on the server (no script).

Three columns: the refs the ledger names, its segments in ledger order, and the generated
turns. An edge from a ref to the segment that holds it (solid), to a segment whose attention
provenance names it (dashed), and to a generated turn whose content provenance names it
(thick). Evicted and quarantined segments are drawn grey and red."""

from __future__ import annotations

from html import escape
from typing import Any

ROW = 26
COLORS = {"live": "#2b6cb0", "quarantined": "#c53030", "evicted": "#a0aec0"}


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def provenance_svg(segments: list[dict[str, Any]]) -> str:
    """The graph of ``segments`` (``SegmentOut`` dicts) as an ``<svg>`` element (escaped text)."""
    refs: list[str] = []
    for seg in segments:
        for r in [seg.get("ref"), *seg.get("provenance", []), *seg.get("content_provenance", [])]:
            if r and r not in refs:
                refs.append(r)
    generated = [s for s in segments if str(s["kind"]).startswith("generated") or s["kind"] == "assistant"]
    others = [s for s in segments if s not in generated]
    x_ref, x_seg, x_gen, width = 10, 300, 590, 860
    rows = max(len(refs), len(others), len(generated), 1)
    height = rows * ROW + 30
    ys: dict[str, int] = {}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="provenance graph">',
             '<text x="10" y="14" class="h">refs</text><text x="300" y="14" class="h">segments</text>'
             '<text x="590" y="14" class="h">generated turns</text>']
    for x, items in ((x_seg, others), (x_gen, generated)):
        for i, seg in enumerate(items):
            y = 30 + i * ROW
            ys[seg["id"]] = y
            color = COLORS.get(seg["state"], "#4a5568")
            label = escape(f"{seg['kind']} {_short(seg['id'], 14)} [{seg['state']}]")
            parts.append(f'<rect x="{x}" y="{y}" width="250" height="20" rx="3" fill="none" stroke="{color}"/>'
                         f'<text x="{x + 4}" y="{y + 14}" fill="{color}">{label}</text>')
    for i, r in enumerate(refs):
        y = 30 + i * ROW
        parts.append(f'<rect x="{x_ref}" y="{y}" width="250" height="20" rx="3" fill="none" stroke="#744210"/>'
                     f'<text x="{x_ref + 4}" y="{y + 14}" fill="#744210"><title>{escape(r)}</title>'
                     f'{escape(_short(r, 34))}</text>')
        for seg in segments:
            sy = ys[seg["id"]]
            x2 = x_gen if seg in generated else x_seg
            color = COLORS.get(seg["state"], "#4a5568")
            if seg.get("ref") == r:
                dash, w = "", 1.5
            elif r in seg.get("content_provenance", []):
                dash, w = "", 3.0
            elif r in seg.get("provenance", []):
                dash, w = ' stroke-dasharray="4 3"', 1.0
            else:
                continue
            parts.append(f'<line x1="{x_ref + 250}" y1="{y + 10}" x2="{x2}" y2="{sy + 10}" stroke="{color}" '
                         f'stroke-width="{w}"{dash}/>')
    parts.append("</svg>")
    return "".join(parts)
