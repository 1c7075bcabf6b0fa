"""The docs a newcomer clones are whole: every relative link in README.md and docs/*.md
names a file of the repository, and nothing in the tree cites a path outside it
(``../shared/``: the design contract lives in ``docs/design.md``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
SOURCE_DIRS = ("fak", "kernel", "cas", "policy", "audit", "api", "sdk", "bench", "tests", "examples", "docs")
SOURCE_EXT = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt"}


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _relative_links(text: str) -> list[str]:
    text = FENCE.sub("", text)  # a link inside a code block is an example, not a link
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http:, mailto:, an anchor in the same page
        out.append(target.split("#", 1)[0])
    return out


def test_relative_links_point_to_files() -> None:
    broken = []
    for doc in _docs():
        for target in _relative_links(doc.read_text(encoding="utf-8")):
            path = (doc.parent / target).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == [], "links to missing files:\n" + "\n".join(broken)


def test_docs_have_links_to_check() -> None:
    # the check above must see the links (a regex that matched nothing would pass)
    readme = _relative_links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/architecture.md" in readme and "docs/design.md" in readme


def test_nothing_cites_a_path_outside_the_repository() -> None:
    """The contract was ``../shared/DESIGN.md``, outside a clone; now ``docs/design.md``. Only
    the copy's header note names its origin."""
    design = ROOT / "docs" / "design.md"
    cites = []
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Makefile"]
    for d in SOURCE_DIRS:
        files += [p for p in (ROOT / d).rglob("*") if p.suffix in SOURCE_EXT and p.is_file()]
    for path in files:
        if path == Path(__file__).resolve() or not path.exists():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if path == design and n == 1:
                continue  # "a copy of ../shared/DESIGN.md, kept in sync"
            if "../shared/" in line or "DESIGN.md" in line:
                cites.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert cites == [], "cites outside the repository (use docs/design.md):\n" + "\n".join(cites)


def test_design_contract_is_in_the_repository() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert "## Exactness vocabulary" in design and "**bit-exact**" in design
