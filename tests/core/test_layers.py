"""The core's layers, read from its source: each part imports only from the parts below it, and the
core imports nothing of the front ends above it (server, gateway, daemon, CLI) nor of Jupyter."""
from __future__ import annotations

import ast

from tests.server.test_imports import PACKAGE, _imports, _modules

#: The core's parts, lowest first: a top-level module (``errors``) or a subpackage (``storage``).
#: A part imports from the parts of lower rows only (and from itself); parts of one row are
#: independent of each other. The checkpointer, the orchestrator, is alone at the top.
LAYERS = (
    ("errors", "sizes", "files", "jsonfile", "hostmemory"),
    ("gpu", "process"),
    ("criu",),
    ("storage",),
    ("objectstore", "forks"),
    ("recovery", "doctor"),
    ("backend", "steps"),
    ("pausing",),
    ("checkpointer",),
)
RANK = {part: rank for rank, row in enumerate(LAYERS) for part in row}
JUPYTER = {"jupyter_server", "jupyter_client", "jupyter_core", "jupyterlab", "tornado", "traitlets", "ipykernel",
           "IPython", "nbformat", "zmq"}


def _part(module: str) -> str:
    return module.split(".")[2]


def test_every_part_of_the_core_has_its_layer():
    """A new module or subpackage of the core is placed in ``LAYERS`` (and so in the picture of
    docs/design.md) before it is used."""
    assert sorted({_part(m) for m in _modules("core")} - set(RANK)) == []


def test_each_part_of_the_core_imports_only_from_below():
    upward = {m: sorted(i for i in _imports(m) if i.startswith("jupyter_gpucr.core.") and _part(i) != _part(m)
                        and RANK[_part(i)] >= RANK[_part(m)]) for m in _modules("core")}
    assert {m: up for m, up in upward.items() if up} == {}


def test_the_core_imports_nothing_of_the_front_ends():
    outside = {m: sorted(i for i in _imports(m) if not i.startswith("jupyter_gpucr.core") and i != "jupyter_gpucr._version")
               for m in _modules("core")}
    assert {m: out for m, out in outside.items() if out} == {}


def test_the_core_imports_nothing_of_jupyter():
    found = {}
    for module in _modules("core"):
        tree = ast.parse(PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py").read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
        jupyter = sorted(n for n in names if n.split(".")[0] in JUPYTER)
        if jupyter:
            found[module] = jupyter
    assert found == {}
