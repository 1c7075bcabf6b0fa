"""The docs name modules that exist: every source path a page cites (``kernel/kv/ledger.py``,
``audit/``, ``api/routes/openai.py::chat_completions``), every bare module file name
(``held.py``), and every dotted name (``fak.kernel.calls.formats``, ``fak.wire.ChatCompletion``)
names a file, folder, module or top-level name of the tree as it is now. A module moved or
renamed without its docs fails here with the page, the line and the stale name."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the source folders and the packages they install as (pyproject.toml, package-dir)
PACKAGES = {"fak": "fak", "kernel": "fak.kernel", "cas": "fak.cas", "policy": "fak.policy", "audit": "fak.audit",
            "api": "fak.api", "sdk": "fak.sdk"}
FOLDERS = (*PACKAGES, "bench", "tests", "examples", "docs")
SKIP = {".venv", ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".hypothesis", "fak.egg-info"}
# a path rooted at a source folder, not part of a longer path, a URL or a string (``<data_dir>/blobs/``,
# ``~/.cache/fak``, ``derive_key(master, "fak/state/held-call")``), with an optional ``::name``
PATH = re.compile(r"(?<![\w/.~<>@\"-])((?:" + "|".join(FOLDERS) + r")/[\w./*-]*)(?:::([\w.*]+))?")
# outputs the tree does not hold (``.gitignore``): a benchmark's JSON
UNTRACKED = ("bench/out/",)
# a bare module file name (``formats.py``), not the tail of a path
BARE = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*\.py)\b")
# a dotted name in the ``fak`` namespace (``fak.kernel.kv.ledger``, ``fak.sdk.local``), not a host
# (``fak.dev/problems``, ``fak.local/log``)
DOTTED = re.compile(r"(?<![\w./-])(fak(?:\.[A-Za-z_]\w*)+)(?![\w/-])")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@functools.cache
def _files() -> frozenset[Path]:
    out = set()
    for folder in FOLDERS:
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and not SKIP.intersection(p.relative_to(ROOT).parts):
                out.add(p.relative_to(ROOT))
    return frozenset(out)


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the ``fak`` namespace and its file."""
    out: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@functools.cache
def _names(path: Path) -> dict[str, frozenset[str]]:
    """The names a module defines at its top level (definitions, assignments, imports, also under
    ``if TYPE_CHECKING`` or ``try``), each with the names its class body defines."""
    out: dict[str, frozenset[str]] = {}

    def members(cls: ast.ClassDef) -> frozenset[str]:
        found = set()
        for n in cls.body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(n.name)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                found.add(n.target.id)
            elif isinstance(n, ast.Assign):
                found |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        return frozenset(found)

    def visit(body: list[ast.stmt]) -> None:
        for n in body:
            if isinstance(n, ast.ClassDef):
                out[n.name] = members(n)
            elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                out[n.name] = frozenset()
            elif isinstance(n, ast.Assign):
                out.update({t.id: frozenset() for t in n.targets if isinstance(t, ast.Name)})
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out[n.target.id] = frozenset()
            elif isinstance(n, ast.Import | ast.ImportFrom):
                out.update({(a.asname or a.name).split(".")[0]: frozenset() for a in n.names})
            elif isinstance(n, ast.If | ast.Try):
                visit(n.body)
                visit(n.orelse)
                if isinstance(n, ast.Try):
                    for h in n.handlers:
                        visit(h.body)
    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def _stale_name(path: Path, dotted: str) -> str | None:
    """Why ``dotted`` (``Class.method`` or ``function``) is not defined in the module at ``path``."""
    first, _, rest = dotted.partition(".")
    names = _names(path)
    if first.endswith("*"):  # ``tests/test_x.py::test_known_answer_*``: some name has the prefix
        return None if any(n.startswith(first[:-1]) for n in names) else f"no {first} in {path.relative_to(ROOT)}"
    if first not in names:
        return f"{first} not defined in {path.relative_to(ROOT)}"
    member = rest.partition(".")[0]
    if member and names[first] and member not in names[first]:
        return f"{first}.{member} not defined in {path.relative_to(ROOT)}"
    return None


def _stale_path(cited: str, name: str | None) -> str | None:
    path = cited.rstrip(".,;:")
    if path.startswith(UNTRACKED):
        return None
    if "-" in path and not Path(path).suffix and not path.endswith("/"):
        return None  # a key-derivation label (``fak/api/key-row-mac``): no module name has a hyphen
    # an all-capitals stem is a placeholder (``bench/NAME.py``), a ``*`` a wildcard: some file must match
    pattern = "/".join("*" + Path(seg).suffix if Path(seg).stem.isupper() and not (ROOT / path).exists() else seg
                       for seg in path.split("/"))
    if "*" in pattern:
        return None if any(ROOT.glob(pattern.rstrip("/"))) else "no file matches"
    full = ROOT / path
    if path.endswith("/"):
        return None if full.is_dir() else "no such folder"
    if Path(path) not in _files() and not full.is_dir():
        return "no such file"
    if name and path.endswith(".py"):
        return _stale_name(full, name.rstrip("."))
    return None


def _stale_dotted(dotted: str) -> str | None:
    parts = dotted.rstrip(".").split(".")
    modules = _modules()
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            rest = parts[cut:]
            if module == "fak" and len(rest) == 1 and rest[0] not in _names(modules[module]):
                return None  # ``fak.tool_calls`` (the response's ``fak`` field), ``fak.create_session()`` (a client)
            return _stale_name(modules[module], ".".join(rest)) if rest else None
    return "no such module"


def _stale_bare(name: str) -> str | None:
    return None if any(p.name == name for p in _files()) else "no file of that name in the tree"


def stale_references(text: str) -> list[tuple[int, str, str]]:
    """(line, cited name, why it is stale) for each module reference of ``text`` the tree lacks."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            why = _stale_path(m.group(1), m.group(2))
            if why:
                found.append((n, m.group(0), why))
        for m in BARE.finditer(line):
            why = _stale_bare(m.group(1))
            if why:
                found.append((n, m.group(1), why))
        for m in DOTTED.finditer(line):
            why = _stale_dotted(m.group(1))
            if why:
                found.append((n, m.group(1), why))
    return found


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_modules_exist(doc: Path) -> None:
    stale = stale_references(doc.read_text(encoding="utf-8"))
    assert stale == [], f"{doc.relative_to(ROOT)} cites what the tree lacks:\n" + "\n".join(
        f"  line {n}: {name} ({why})" for n, name, why in stale)


def test_the_check_sees_references() -> None:
    """The architecture page cites paths, bare names and dotted names, and the check catches a stale one
    of each kind (a regex that matched nothing would pass every page)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(PATH.findall(text)) > 50 and len(DOTTED.findall(text)) > 5 and len(BARE.findall(text)) > 5
    stale = "`kernel/kv/replay.py`, `kernel/calls/authorize.py::no_such`, `tool_formats.py`, " \
            "`fak.kernel.openai_params`, `fak.wire.NoSuchModel`, `fak.kernel.kv.session.Session.no_such`"
    assert [name for _, name, _ in stale_references(stale)] == [
        "kernel/kv/replay.py", "kernel/calls/authorize.py::no_such", "tool_formats.py", "fak.kernel.openai_params",
        "fak.wire.NoSuchModel", "fak.kernel.kv.session.Session.no_such"]
    fine = "`kernel/kv/ledger.py`, `kernel/calls/authorize.py::args_digest`, `formats.py`, `kernel/model/`, " \
           "`fak.kernel.calls.formats`, `fak.sdk.local()`, `fak.kernel.kv.session.Session.append`, `~/.cache/fak`, " \
           "`<data_dir>/blobs/`, `bench/*.py`, https://example.org/kernel/gone.py"
    assert stale_references(fine) == []
