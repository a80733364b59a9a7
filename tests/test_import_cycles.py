"""No import cycles in tokenswift/: the module import graph, read from the source with `ast`, has no cycle.

What counts as an edge A -> B (B a module of tokenswift): any `import` or `from ... import` statement anywhere in
A's file, at module level, inside functions and methods, and under `if TYPE_CHECKING:`. A late import inside a
function only hides a cycle from the interpreter, and a type-only import still ties the two modules' designs
together, so both count. `from P import name` is an edge to the submodule P.name when there is one, else to P.
Not counted: the parent packages that Python runs when it imports a submodule (importing tokenswift.serve.runner
runs tokenswift/__init__.py, which re-exports the public API; counting that would make every module depend on
that API), and dynamic imports by name (importlib.import_module), which the benchmarks use to time parts of the
engine. An explicit `import tokenswift` or `from tokenswift import X` inside the package does count.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tokenswift"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules its file imports (see the module docstring for what counts)."""
    root = package.parent
    files = {module_name(p, root): p for p in package.rglob("*.py")}
    top = package.name
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # the package `.` refers to
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in files:  # `import a.b.c` -> the deepest module that exists
                        target = target.rpartition(".")[0]
                    if target:
                        edges.add(target)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source != top and not source.startswith(top + "."):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    edges.add(sub if sub in files else source)
        edges.discard(name)
        graph[name] = {e for e in edges if e in files}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; [] when acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
    return sorted(found)


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & inside)]
    return f"{', '.join(component)}:\n    " + "\n    ".join(edges)


def test_tokenswift_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "tokenswift.generator" in graph["tokenswift"]  # the graph was read, not empty
    found = cycles(graph)
    if not found:
        return
    report = "\n".join(describe(graph, c) for c in found)
    pytest.fail("import cycles in tokenswift/ (each group imports itself round a loop):\n" + report)


def test_the_benchmarks_are_a_leaf():
    """Nothing in the engine or the serving layer imports tokenswift.bench (the memory readers they need live in
    tokenswift.memory)."""
    graph = import_graph(PACKAGE)
    importers = sorted(v for v, ws in graph.items() if not v.startswith("tokenswift.bench")
                       and any(w == "tokenswift.bench" or w.startswith("tokenswift.bench.") for w in ws))
    assert not importers, importers


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "tokenswift"


def test_the_check_finds_late_type_only_and_relative_cycles(tmp_path):
    """The check can fail: a cycle closed by a late import inside a function, one through a TYPE_CHECKING import
    and one through `from . import x` are each found; the package's own __init__ re-exports are not a cycle."""
    package = write_package(tmp_path, {
        "tokenswift/__init__.py": "from .generator import Generator\n",
        "tokenswift/generator.py": "from .settings import Settings\nfrom .validate import check\nclass Generator: ...\n",
        "tokenswift/settings.py": "from .validate import rules\nclass Settings: ...\n",
        "tokenswift/validate.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .generator import "
                                   "Generator\ndef rules(): ...\ndef check():\n    from .settings import Settings\n"),
        "tokenswift/serve/__init__.py": "",
        "tokenswift/serve/a.py": "from . import b\n",
        "tokenswift/serve/b.py": "def f():\n    from tokenswift.serve.a import g\n",
        "tokenswift/leaf.py": "import tokenswift.serve.a\nimport torch\n",
    })
    graph = import_graph(package)
    assert graph["tokenswift.leaf"] == {"tokenswift.serve.a"}
    assert cycles(graph) == [["tokenswift.generator", "tokenswift.settings", "tokenswift.validate"],
                             ["tokenswift.serve.a", "tokenswift.serve.b"]]
    assert "tokenswift.validate -> tokenswift.generator" in describe(graph, cycles(graph)[0])

    package = write_package(tmp_path / "fixed", {
        "tokenswift/__init__.py": "from .generator import Generator\n",
        "tokenswift/generator.py": "from .validate import check\nclass Generator: ...\n",
        "tokenswift/validate.py": "def check(): ...\n",
    })
    assert cycles(import_graph(package)) == []
