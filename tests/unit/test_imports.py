"""Structure checks over the project's modules (rollout/, serve/, ops/): no import circles, no
import of another module's private name, few top-level entries in ops/, no function over 50
lines.

Import circles:
Every `import` and `from ... import` is read with ast, at any depth (an import inside a function
or under `if TYPE_CHECKING:` counts: it only hides the circle). A name imported from a package
(`from rollout import Windows`) counts as an import of the module the package takes it from,
so the lazy re-exports of `rollout/__init__.py` do not make every module look circular. Importing
a submodule is not counted as importing its parent package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rollout", "serve", "ops")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[Path, ast.Module]]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = (path, ast.parse(path.read_text(), str(path)))
    return found


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a `from X import ...` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, tree: ast.Module) -> list[tuple[str, str | None]]:
    """(module, name) pairs: `import a.b` -> ("a.b", None); `from a import b` -> ("a", "b")."""
    pairs: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, path.name == "__init__.py", node)
            pairs += [(source, alias.name) for alias in node.names]
    return pairs


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    sources = _sources()
    imports = {module: _imports(module, path, tree) for module, (path, tree) in sources.items()}
    # where each package takes the names it re-exports from
    reexports = {
        package: {name: source for source, name in pairs if name and source in sources}
        for package, pairs in imports.items()
        if sources[package][0].name == "__init__.py"
    }

    def target(source: str, name: str | None) -> str | None:
        if name is not None and f"{source}.{name}" in sources:  # from pkg import submodule
            return f"{source}.{name}"
        if name is not None and name in reexports.get(source, {}):
            return target(reexports[source][name], name)
        return source if source in sources else None

    graph: dict[str, set[str]] = {}
    for module, pairs in imports.items():
        edges = {target(source, name) for source, name in pairs} - {None, module}
        graph[module] = {edge for edge in edges if edge is not None}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_sees_function_level_and_package_imports():
    graph = import_graph()
    assert "rollout.telemetry.windows" in graph["rollout.status"]
    assert "rollout.redis_store" in graph["rollout"]  # imported inside open_store
    assert "ops.cli.commands" in graph["ops.cli"]  # imported inside main


def test_no_module_imports_one_that_imports_it_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_to(dotted: str) -> str | None:
    """The package a module path is private to (the parent of its first `_` part), or None."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[:i])
    return None


def private_imports(sources: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """Imports that reach into another module's privates: `from X import _name` (a name private
    to module X), and a `_module` imported from outside its package. A `_` means private to its
    module, or for a module to its package, as in httpx; nothing outside uses it."""
    found = []
    for module, (path, tree) in sources.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for source, name in _imports(module, path, tree):
            if source.split(".")[0] not in PACKAGES:
                continue
            submodule = name is not None and f"{source}.{name}" in sources
            target = f"{source}.{name}" if submodule else source
            owner = _private_to(target)
            if owner is not None and package != owner and not package.startswith(owner + "."):
                found.append(f"{module} imports {target}, private to {owner}")
            elif name and not submodule and _private(name) and source != module:
                found.append(f"{module}: from {source} import {name}")
    return found


def test_the_private_import_finder_finds_them():
    def parsed(files: dict[str, str]) -> dict[str, tuple[Path, ast.Module]]:
        return {name.removesuffix(".__init__"): (Path(name.replace(".", "/") + ".py"),
                                                  ast.parse(code)) for name, code in files.items()}

    assert private_imports(parsed({
        "rollout.__init__": "", "rollout.a": "_X = 1\ndef _f(): pass",
        "rollout.b": "from rollout.a import _X, _f",
        "serve.__init__": "", "serve._m": "", "serve.c": "from serve._m import f",
        "ops.__init__": "from __future__ import annotations\nfrom serve import _m",
    })) == ["rollout.b: from rollout.a import _X", "rollout.b: from rollout.a import _f",
            "ops imports serve._m, private to serve"]


def test_no_module_imports_a_private_name_from_another():
    """Anywhere in the tree, the tests included: a test uses what callers can use."""
    found = private_imports(_sources(PACKAGES + ("tests",)))
    assert not found, "make the name public (no leading _) or keep it in its module: " + \
        "; ".join(found)


def test_ops_has_few_top_level_entries():
    """ops/ in wings (cli/, drill/, verify/, bench/, load/, generate/), at most 15 entries, so
    that its architecture shows in one listing; the rest are scripts and configuration files."""
    entries = [p.name for p in (ROOT / "ops").iterdir()
               if p.name != "__pycache__" and not p.name.startswith(".")]
    assert len(entries) <= 15, sorted(entries)


MAX_FUNCTION_LINES = 50  # a function longer than this is split where it turns


def long_functions(sources: dict[str, tuple[Path, ast.Module]],
                   limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (method, nested function) of `sources` longer than `limit` lines,
    decorators excluded, as 'module.name (N lines)'."""
    found = []
    for module, (_, tree) in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{module}.{node.name} ({lines} lines)")
    return found


def test_the_long_function_finder_finds_one():
    body = "\n".join(f"    x{i} = {i}" for i in range(51))
    tree = ast.parse(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions({"m": (Path("m.py"), tree)}) == ["m.long (52 lines)"]


def test_no_function_is_longer_than_fifty_lines():
    assert long_functions(_sources()) == []

