"""The package's import graph, read from its source: layers only import downwards, and no layer
has an import loop."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    """Every module of ``layer``, those of its subpackages included."""
    return [".".join(("jupyter_gpucr", *p.relative_to(PACKAGE).with_suffix("").parts))
            for p in sorted((PACKAGE / layer).rglob("*.py")) if p.stem != "__init__"]


def test_the_server_imports_nothing_from_the_cli():
    """The doctor's checks are the core's; the CLI and the server each only show them."""
    assert {m: sorted(i for i in _imports(m) if i.startswith("jupyter_gpucr.cli")) for m in _modules("server")} == {
        m: [] for m in _modules("server")}


def _loops(layer: str) -> list[list[str]]:
    """Each module of ``layer`` that reaches itself again through the layer's imports, with the way back."""
    modules = set(_modules(layer))
    loops = []
    for start in sorted(modules):
        seen, todo = {start}, [[start]]
        while todo:
            path = todo.pop()
            for nxt in sorted(_imports(path[-1]) & modules):
                if nxt == start:
                    loops.append([m.rsplit(".", 1)[1] for m in [*path, nxt]])
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append([*path, nxt])
    return loops


@pytest.mark.parametrize("layer", ["core", "server", "daemon", "cli", "gateway"])
def test_no_import_loop(layer):
    """No module imports one that imports it back, directly or around a circle. In the server:
    the kernel manager builds the runtime, whose parts ask the kernel manager for its kernels and
    each other for what they use through ``server/kernels.py``'s protocols. In the core: the checkpointer calls the
    forks and the sessions, which type it through protocols; CRIU's runner and the store share
    ``files.py``; ``running.py`` holds what they all hand back."""
    assert _loops(layer) == []
