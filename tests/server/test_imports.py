"""The server's import graph, read from its source: layers only import downwards."""
from __future__ import annotations

import ast
from pathlib import Path

import jupyter_gpucr

PACKAGE = Path(jupyter_gpucr.__file__).parent


def _imports(module: str) -> set[str]:
    """The jupyter_gpucr modules ``module`` imports, ``TYPE_CHECKING`` blocks and function bodies included."""
    path = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
    package = module.rsplit(".", 1)[0].split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if PACKAGE.joinpath(*sub.split(".")[1:]).with_suffix(".py").exists() else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("jupyter_gpucr")}


def _modules(layer: str) -> list[str]:
    return [f"jupyter_gpucr.{layer}.{p.stem}" for p in sorted((PACKAGE / layer).glob("*.py")) if p.stem != "__init__"]


def test_the_server_imports_nothing_from_the_cli():
    """The doctor's checks are the core's; the CLI and the server each only show them."""
    assert {m: sorted(i for i in _imports(m) if i.startswith("jupyter_gpucr.cli")) for m in _modules("server")} == {
        m: [] for m in _modules("server")}


def test_no_import_loop_in_the_server():
    """The kernel manager makes the suspender and the suspender asks the kernel manager for its
    kernels (through ``server/kernels.py``'s protocol): neither module may import the other back."""
    modules = _modules("server")
    loops = []
    for start in modules:
        seen, todo = set(), [start]
        while todo:
            for nxt in _imports(todo.pop()) & set(modules):
                if nxt == start:
                    loops.append(start)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    assert sorted(set(loops)) == []
