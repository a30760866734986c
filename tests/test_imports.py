"""The modules of tunecore import each other without cycles.

Every import counts: at module level, inside functions (lazy imports only hide a cycle until the
day someone moves them) and under ``if TYPE_CHECKING`` (a type-only cycle is still two modules that
cannot be understood apart).

Loading a plugin by name is not an import: the plugin manager loads ``tunecore.builtin`` by its name
the way it loads an installed plugin by its entry point, and the built-in plugin, like any plugin,
sits above everything it registers. The test checks that nothing in the core imports it directly.
"""

import ast
import pathlib

import tunecore

PACKAGE = pathlib.Path(tunecore.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The tunecore modules ``path`` imports, by their module names."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from tunecore.x import y` imports the module tunecore.x.y when there is one
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    edges = set()
    for target in found:
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        if target in modules and target != name:
            edges.add(target)
    return edges


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [node])):
                return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_tunecore_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_builtin_plugin_is_on_top():
    graph = import_graph()
    importers = {module for module, imported in graph.items() if not module.startswith("tunecore.builtin")
                 and any(i.startswith("tunecore.builtin") for i in imported)}
    assert importers == set(), f"{importers} import the built-in plugin; look components up in the registry instead"


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "tunecore.data" in graph["tunecore.roles"] and "tunecore.tvmjson" in graph["tunecore.data"]


PUBLIC = ("tunecore", "tunecore.interfaces", "tunecore.targets", "tunecore.dataset", "tunecore.cli")
PLUGINS = PACKAGE.parent / "plugins"


def plugin_imports() -> list[tuple[str, str, str | None]]:
    """(file, tunecore module, imported name or None) for every import of tunecore in the shipped plugins' code,
    at module level and inside functions alike."""
    found = []
    for path in sorted(PLUGINS.glob("*/tunecore_*/**/*.py")):
        where = str(path.relative_to(PLUGINS))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(where, a.name, None) for a in node.names if a.name.split(".")[0] == "tunecore"]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "tunecore":
                found += [(where, node.module, a.name) for a in node.names]
    return found


def test_shipped_plugins_use_the_public_surface_only():
    """A plugin imports from the public modules only (tunecore.interfaces says which), and only the names their
    ``__all__`` lists: a refactor of anything else cannot break a plugin."""
    import importlib

    imports = plugin_imports()
    assert len(imports) > 50  # the finder finds them
    internal = sorted({f"{where}: {module}" for where, module, _ in imports if module not in PUBLIC})
    assert not internal, f"plugins import internal modules: {internal}"
    unlisted = sorted({f"{where}: {module}.{name}" for where, module, name in imports
                       if name is not None and name not in importlib.import_module(module).__all__})
    assert not unlisted, f"plugins import names the public modules do not export: {unlisted}"
    assert len(PUBLIC) <= 5
