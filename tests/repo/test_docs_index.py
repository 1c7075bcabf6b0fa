"""The docs speak to users: every page of ``docs/`` is reachable from the README's index, and
no page but the claims register cites the project's internal work items ("issue 25.9"), which
a reader cannot look up (CLAIMS.md keeps them beside its test and bench names)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK_ITEM = re.compile(r"\bissues? ?#?\d+(?:\.\d+)?\b", re.IGNORECASE)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([A-Za-z0-9_.-]+\.md)(?:#[^)]*)?\)", readme))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), f"docs pages the README's index does not link: {sorted(pages - linked)}"


def test_no_user_facing_page_cites_an_internal_work_item() -> None:
    found = [f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
             for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if page.name != "CLAIMS.md"
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             for m in WORK_ITEM.finditer(line)]
    assert found == [], found


def test_the_work_item_pattern_finds_what_it_must() -> None:
    assert WORK_ITEM.search("as issue 25.9 said") and WORK_ITEM.search("(issue #32)")
    assert not WORK_ITEM.search("an issue the reader can open")
