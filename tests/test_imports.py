"""The package's import graph has no cycle: built from the source with ``ast``, function-level and
``TYPE_CHECKING`` imports included, so an import moved into a function to dodge a cycle still counts."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shardkit"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module → the package modules it imports anywhere in its source (``from . import x`` → the submodule)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path.name == "__init__.py", node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:  # a name inside a module → the module
                    target = target.rpartition(".")[0]
                if target.startswith("shardkit") and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from .pipeline import _owned\n"
    node = ast.parse(source).body[0].body[0]  # type: ignore[attr-defined]
    assert _resolve("shardkit.conversion.staging", False, node) == "shardkit.conversion.pipeline"


def test_the_package_import_graph_is_acyclic() -> None:
    graph = import_graph()
    assert "shardkit.formats.base" in graph and "shardkit.cli" in graph
    assert cycles(graph) == []


#: The package's layers, lowest first (docs/architecture.md): each module belongs to the layer of the longest prefix
#: that names it. A new module must be given a layer here.
LAYERS: dict[str, tuple[str, ...]] = {
    "foundation": ("_version", "errors", "testing", "support", "augment.seeding", "read.residency"),
    "core": ("files", "codecs", "images", "volumes"),
    "formats": ("formats",),
    "labels": ("labels",),
    "augment": ("augment",),
    "store": ("store",),
    "convert": ("conversion",),
    "read": ("read", "tf", "grain"),
    "audit": ("audit",),
    "front": ("", "__main__", "cli", "bench", "show", "verify", "diff", "demo", "tiles",
              "audit.page"),  # the audit page draws its sample pictures with show's drawing
}
#: which layers each layer may import (besides its own); front may import anything
MAY_IMPORT: dict[str, set[str]] = {
    "foundation": set(),
    "core": {"foundation"},
    "formats": {"core", "foundation"},
    "labels": {"core", "foundation"},
    "augment": {"core", "foundation"},
    "store": {"formats", "core", "foundation"},
    "convert": {"store", "formats", "labels", "core", "foundation"},
    "read": {"store", "formats", "augment", "core", "foundation"},
    "audit": {"read", "store", "formats", "labels", "augment", "core", "foundation"},
    "front": set(LAYERS),
}
#: imports across layers that are allowed anyway, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("shardkit.read.cache", "shardkit.conversion.config"): "parse_bytes ('4GB' → bytes) for cache_limit; lives "
                                                           "with the convert options' parsers",
}


def layer_of(module: str) -> str | None:
    """The layer whose longest prefix names ``module`` (``shardkit`` itself is the empty name); None if none."""
    name = module.removeprefix("shardkit").removeprefix(".")
    best: tuple[int, str] | None = None
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            named = name == prefix or (prefix and name.startswith(prefix + "."))
            if named and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return best[1] if best else None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        src = layer_of(module)
        for target in sorted(targets):
            dst = layer_of(target)
            if src is None or dst is None or dst == src or dst in MAY_IMPORT[src] or (module, target) in EXCEPTIONS:
                continue
            found.append(f"{module} ({src}) imports {target} ({dst})")
    return found


def test_every_module_has_a_layer() -> None:
    unassigned = sorted(m for m in import_graph() if layer_of(m) is None)
    assert unassigned == [], f"give these modules a layer in tests/test_imports.py LAYERS: {unassigned}"


def test_no_module_imports_a_layer_above_or_beside_its_own() -> None:
    graph = import_graph()
    assert layer_violations(graph) == []
    # the rule sees a back-edge: a format reaching up into the convert pipeline
    assert layer_violations({"shardkit.formats.npy": {"shardkit.conversion.pipeline"}}) == [
        "shardkit.formats.npy (formats) imports shardkit.conversion.pipeline (convert)"]
    assert layer_of("shardkit") == "front" and layer_of("shardkit.augment.seeding") == "foundation"
    assert all((a in graph and b in graph[a]) for a, b in EXCEPTIONS), "an exception that no longer happens"
