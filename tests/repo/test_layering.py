"""The layering the tree promises, read from its import graph (issue 26, "Layering"): every
``import`` of the non-test packages parsed with ``ast``, function-local ones included, so a
cycle cannot hide behind a local import."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the source folders and the packages they install as (pyproject.toml, package-dir)
PACKAGES = {"fak": "fak", "kernel": "fak.kernel", "cas": "fak.cas", "policy": "fak.policy", "audit": "fak.audit",
            "api": "fak.api", "sdk": "fak.sdk"}
# the mechanisms under the agent kernel: the model forward and the KV structures (``kernel/model``, ``kernel/kv``)
MECHANISMS = ("fak.kernel.model", "fak.kernel.kv")
# the agent kernel built on them (``kernel/`` but ``model/`` and ``kv/``): the mechanisms never reach up into it
AGENT_KERNEL = tuple(sorted(
    ".".join(["fak.kernel", *p.relative_to(ROOT / "kernel").with_suffix("").parts]).removesuffix(".__init__")
    for p in (ROOT / "kernel").rglob("*.py") if p.relative_to(ROOT / "kernel").parts[0] not in ("model", "kv")
    and p.name != "__init__.py" or p.parent.name in ("openai", "calls", "withdrawal", "session", "gateway", "mcp")))
# the agent kernel's parts (issue 42) and what each may import of the kernel besides the mechanisms:
# tool calls sit on the KV structures; withdrawal on the services; the agent session on both; the
# gateway (issue 43: upstream models, sessions without KV) on the session's admission and decisions;
# the OpenAI door on top, beside the REST operations layer (``operations``), not on it: the caller
# and its rights (``session.caller``) and the token helpers (``session.tokens``) that both use
# are the session part's. The root modules (``facade``, ``services``, ``events``, ``operations``,
# ``cli``, ``demo``) wire the parts together. MCP (issue 47: servers the deployment declares, their
# connections and pinned tool descriptions) is a mechanism with its records: it imports no other part.
# The MCP gateway (issue 47 item 4, ``fak.kernel.gateway.mcp_gateway``: ``/mcp`` for clients that run
# tools themselves) is the gateway's: it decides a client's calls in a kernel session and forwards the
# allowed ones to those servers, so the gateway may import ``fak.kernel.mcp``.
PARTS: dict[str, tuple[str, ...]] = {
    "fak.kernel.calls": (),
    "fak.kernel.mcp": (),
    "fak.kernel.withdrawal": ("fak.kernel.events", "fak.kernel.services"),
    "fak.kernel.session": ("fak.kernel.calls", "fak.kernel.withdrawal", "fak.kernel.events", "fak.kernel.services"),
    "fak.kernel.gateway": ("fak.kernel.calls", "fak.kernel.session", "fak.kernel.events", "fak.kernel.services",
                           "fak.kernel.mcp"),
    "fak.kernel.openai": ("fak.kernel.calls", "fak.kernel.session", "fak.kernel.gateway", "fak.kernel.events",
                          "fak.kernel.services", "fak.kernel.mcp"),
}
# the packages whose modules must not import each other in a cycle: everything but the adapters
CORE = ("fak", "fak.kernel", "fak.policy", "fak.cas", "fak.audit", "fak.state")
ADAPTERS = ("fak.api", "fak.sdk")
# the shared ground (``fak/``): types, errors, settings, database, keys, wire models; every layer builds on it


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (``from a.b import c`` gives ``a.b`` and ``a.b.c``)
    line: int
    module_level: bool  # outside any function (a ``TYPE_CHECKING`` block is not an import at all)


def _module_name(folder: str, path: Path) -> str:
    parts = [PACKAGES[folder], *path.relative_to(ROOT / folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, is_package: bool, tree: ast.Module) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub, module_level)
                continue
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, module_level) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = module.split(".")[: len(module.split(".")) - child.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append(Import(module, base, child.lineno, module_level))
                found.extend(Import(module, f"{base}.{a.name}", child.lineno, module_level) for a in child.names)
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, module_level and not inner)

    visit(tree, True)
    return found


def _graph() -> list[Import]:
    edges: list[Import] = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue  # Alembic scripts: loaded by Alembic, not imported
            module = _module_name(folder, path)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            edges += _imports(module, path.name == "__init__.py", tree)
    return edges


EDGES = _graph()


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _shown(edges: list[Import]) -> list[str]:
    return sorted({f"{e.source}:{e.line} imports {e.target}" for e in edges})


def test_the_graph_is_read() -> None:
    """The parser sees the tree (a broken walk would make every other test here pass)."""
    sources = {e.source for e in EDGES}
    assert {"fak.kernel.facade", "fak.kernel.model.llama", "fak.policy.late", "fak.cas.store", "fak.api.app"} <= sources
    assert any(e.source == "fak.policy.late" and e.target == "fak.policy.classifier" and not e.module_level
               for e in EDGES)  # a function-local import is seen, with its place


def test_policy_never_imports_the_model_package_nor_torch_at_module_level() -> None:
    """The late-detector classifier lives in ``fak.policy`` and loads torch itself, inside its
    scoring function, so ``fak.policy`` needs nothing of ``fak.kernel`` (it imported
    ``fak.kernel.classifier``, which imported ``fak.policy.late`` back: a cycle), and importing
    it (gate, loader, judge) never loads torch."""
    bad = [e for e in EDGES if _within(e.source, "fak.policy") and (
        _within(e.target, "fak.kernel") or (_within(e.target, "torch") and e.module_level))]
    assert not bad, _shown(bad)
    assert any(e.source == "fak.policy.classifier" and e.target == "torch" and not e.module_level for e in EDGES)


def test_mechanisms_do_not_reach_up() -> None:
    """``fak.kernel.model`` (the forward, its weight formats, ``fak generate`` / ``fak info``) and
    ``fak.kernel.kv`` (the KV cache, ledger, prefix and PIC reuse, the model session) import
    neither the policy layer, the store, the log, the server, the SDK nor the agent kernel
    above them: ``fak demo`` is the agent kernel's command (``fak.kernel.cli``)."""
    above = ("fak.policy", "fak.cas", "fak.audit", "fak.api", "fak.sdk", *AGENT_KERNEL)
    bad = [e for e in EDGES if any(_within(e.source, m) for m in MECHANISMS)
           and any(_within(e.target, p) for p in above)]
    assert not bad, _shown(bad)
    # the forward owns only its cache tensors (``model.kv_cache``); segments and reuse build on it
    model_up = [e for e in EDGES if _within(e.source, "fak.kernel.model") and _within(e.target, "fak.kernel.kv")]
    assert not model_up, _shown(model_up)


def test_the_tree_shows_the_architecture() -> None:
    """Issue 26 part 7: the agent kernel lives in ``kernel/`` over its two mechanism subpackages,
    and ``fak/`` keeps only the shared ground, which imports no layer built on it at any level,
    inside a function included (a local import would only hide the edge): what it needs of a
    layer lives in it (``fak.egress``, ``fak.scrub``, ``fak.errors.ContentStoreError``). The lazy
    ``from fak import Kernel`` is a name lookup, not an import edge; ``fak.cli`` gathers each
    layer's subcommands and ``fak.cli_reference`` writes the README's tables from them, so neither is
    part of the ground."""
    # the façade, sessions, the transaction, withdrawal, materialisation and authorization
    for part in ("facade", "session.kernel_session", "session.transaction", "withdrawal.forget",
                 "withdrawal.quarantine", "session.materialise", "calls.authorize", "openai.chat"):
        assert f"fak.kernel.{part}" in AGENT_KERNEL, part
    assert not [m for m in AGENT_KERNEL if any(_within(m, mech) for mech in MECHANISMS)]
    # nothing but the five parts and the wiring modules sits in ``kernel/``
    assert {p.name for p in (ROOT / "kernel").iterdir() if not p.name.startswith("__")} == {
        "model", "kv", "openai", "calls", "withdrawal", "session", "gateway", "mcp",
        "facade.py", "services.py", "events.py", "operations.py", "cli.py", "demo.py"}
    ground = {"cli_options", "db", "egress", "errors", "faults", "keys", "owner", "protocols", "scrub", "settings",
              "types", "wire", "wire_responses"}
    assert {p.stem for p in (ROOT / "fak").glob("*.py")} <= {"__init__", "cli", "cli_reference", *ground}
    layers = ("fak.kernel", "fak.cas", "fak.policy", "fak.audit", "fak.api", "fak.sdk")
    sources = {e.source for e in EDGES if e.source == "fak" or e.source.split(".")[1] in {*ground, "state"}}
    assert {"fak", "fak.settings", "fak.state.store", "fak.db"} <= sources  # the walk reaches the ground
    bad = [e for e in EDGES if e.source in sources and any(_within(e.target, lay) for lay in layers)]
    assert not bad, "the shared ground imports a layer built on it: " + "; ".join(_shown(bad))


def test_kernel_parts_import_only_below_them() -> None:
    """Issue 42: each part of the agent kernel imports the mechanisms, the shared ground and the
    parts ``PARTS`` names for it, at any level (inside a function included); nothing but the
    adapters (``fak.api``, ``fak.sdk``) imports the OpenAI door, which sits on top."""
    kernel_parts = ("fak.kernel.openai", "fak.kernel.calls", "fak.kernel.withdrawal", "fak.kernel.session",
                    "fak.kernel.gateway", "fak.kernel.mcp",
                    "fak.kernel.facade", "fak.kernel.services", "fak.kernel.events", "fak.kernel.operations",
                    "fak.kernel.cli", "fak.kernel.demo")
    bad = []
    for part, allowed in PARTS.items():
        for e in EDGES:
            if not _within(e.source, part) or _within(e.target, part) or not _within(e.target, "fak.kernel"):
                continue
            if e.target == "fak.kernel" or any(_within(e.target, m) for m in MECHANISMS):
                continue
            if not any(_within(e.target, a) for a in allowed) and any(_within(e.target, k) for k in kernel_parts):
                bad.append(e)
    assert not bad, _shown(bad)
    into_door = [e for e in EDGES if _within(e.target, "fak.kernel.openai") and not _within(e.source, "fak.kernel.openai")
                 and not any(_within(e.source, a) for a in ADAPTERS)]
    assert not into_door, _shown(into_door)
    # the walk sees the parts: the door reads calls and sessions, a session authorizes calls
    assert any(_within(e.source, "fak.kernel.openai") and _within(e.target, "fak.kernel.calls") for e in EDGES)
    assert any(_within(e.source, "fak.kernel.session") and _within(e.target, "fak.kernel.calls") for e in EDGES)


def test_key_operations_do_not_import_the_model() -> None:
    """``fak.kernel.withdrawal.keys`` (KEK rotation and destruction, logged) and the ``fak cas`` / ``fak audit``
    commands import no part of the model package, the session layer or torch, at any level
    (``tests/ground/test_cli_imports.py`` runs the commands and checks what they load)."""
    heavy = (*MECHANISMS, "fak.kernel.session.kernel_session", "fak.kernel.facade", "torch")
    sources = ("fak.kernel.withdrawal.keys", "fak.cas.cli", "fak.audit.cli")
    bad = [e for e in EDGES if e.source in sources and any(_within(e.target, h) for h in heavy)]
    assert not bad, _shown(bad)


def test_shared_ground_does_not_import_what_builds_on_it() -> None:
    """Cycles issue 26 removed stay removed: ``fak.settings`` imports no part of the model
    package (the serving default weight format is ``fak.kernel.model.blockdot.default_weights``,
    asked by ``Kernel.open``); a late detector imports what it returns and raises from
    ``fak.policy.late_detector``, not the module that builds it; the log signs a tenant
    statement from ``fak.audit.statement`` without importing the export that reads it."""
    below = {"fak.settings": ("fak.kernel",), "fak.policy.classifier": ("fak.policy.late",),
             "fak.policy.judge": ("fak.policy.late",), "fak.policy.late_detector": ("fak.policy.late",),
             "fak.audit.log": ("fak.audit.tenant_export",), "fak.audit.statement": ("fak.audit.log",)}
    bad = [e for e in EDGES if e.source in below and e.target in below[e.source] or (
        e.source == "fak.settings" and _within(e.target, "fak.kernel"))]
    assert not bad, _shown(bad)


def test_sdk_does_not_import_the_server() -> None:
    """The SDK's wire models come from ``fak.wire`` (pydantic and ``fak.types`` only), the very
    classes the routes declare; the in-process mode (``fak.sdk.local``) calls the
    kernel's operations (``fak.kernel.operations``), as the routes do. So no module of
    ``fak.sdk`` imports ``fak.api``, not even inside a function, and the operations never import
    the server either. ``tests/sdk/test_sdk_imports.py`` checks what an import of the HTTP client
    loads, ``tests/sdk/test_sdk_client_only_install.py`` that it installs and runs without the server."""
    to_api = [e for e in EDGES if _within(e.source, "fak.sdk") and _within(e.target, "fak.api")]
    assert not to_api, _shown(to_api)
    core_to_api = [e for e in EDGES if e.source in ("fak.kernel.operations", "fak.kernel.openai.chat")
                   and _within(e.target, "fak.api")]
    assert not core_to_api, _shown(core_to_api)
    assert any(e.source == "fak.sdk.inprocess" and e.target == "fak.kernel.operations" for e in EDGES)
    assert any(e.source == "fak.api.routes.openai" and e.target == "fak.kernel.openai.chat" for e in EDGES)
    wire = {e.target.split(".")[0] if not e.target.startswith("fak.") else e.target
            for e in EDGES if e.source == "fak.wire"}
    assert {t for t in wire if t.startswith("fak.")} <= {"fak.types", "fak.types.Digest", "fak.types.Id"}, wire
    assert {t for t in wire if not t.startswith("fak.")} <= {"__future__", "base64", "typing", "pydantic"}, wire


def _modules() -> dict[str, bool]:
    """Every module of the tree, and whether it is a package (``__init__.py``)."""
    out: dict[str, bool] = {}
    for folder in PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            if "migrations" not in path.parts:
                out[_module_name(folder, path)] = path.name == "__init__.py"
    return out


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_core_has_no_import_cycles() -> None:
    """Issue 26 part 1: the core's modules (everything but the API and the SDK) import each other
    without a cycle, counting imports inside functions (a local import does not break a cycle,
    it hides it) and leaving out ``TYPE_CHECKING`` blocks (no import at run time). The façade
    builds the services and hands them down; nothing below it imports it. A module importing
    its own package's ``__init__`` is not an edge (every submodule does it); one importing
    another package's ``__init__`` is (that ``__init__`` imports its modules)."""
    modules = _modules()
    core = {m for m in modules if any(_within(m, c) for c in CORE) and not any(_within(m, a) for a in ADAPTERS)}

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {m: set() for m in core}
    for e in EDGES:
        target = resolve(e.target)
        if e.source not in core or target not in core or target == e.source:
            continue
        if modules[target] and _within(e.source, target):
            continue
        graph[e.source].add(target)
    cycles = _sccs(graph)
    assert not cycles, "import cycles in the core: " + "; ".join(" <-> ".join(c) for c in cycles)
    assert "fak.kernel.services" in graph["fak.kernel.withdrawal.forget"]  # the graph holds the edges it should


def test_nothing_below_the_facade_imports_it() -> None:
    """Sessions, withdrawal, working sets, the replay and the services take the services the
    façade built, not the façade: no module of the agent kernel imports it, not even for the
    type checker (``fak chat`` / ``fak demo`` and the operations adapters use it)."""
    users = {"fak.kernel.cli", "fak.kernel.demo", "fak.kernel.operations", "fak.kernel.openai.chat",
             "fak.kernel.openai.responses"}
    bad = []
    for folder, package in (("kernel", "fak.kernel"),):
        for path in sorted((ROOT / folder).glob("*.py")):
            module = _module_name(folder, path)
            if module in users or module == "fak.kernel.facade":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            bad += [f"{module}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import)
                    and any(_within(name, "fak.kernel.facade") for name in (
                        [n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names]))]
            assert package
    assert not bad, bad
    local = [e for e in EDGES if e.source == "fak.kernel.facade" and not e.module_level]
    assert not local, _shown(local)  # the façade imports what it uses at module level
