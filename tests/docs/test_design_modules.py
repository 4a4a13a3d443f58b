"""docs/design.md lists every module of the package in a line (its "Every module" block), so that
a reader finds where a thing lives; a module added without that line fails here."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jupyter_gpucr"
NOT_MODULES = ("__init__.py", "_version.py")


def _listed() -> set[str]:
    """The paths (relative to jupyter_gpucr/) that start a line of design.md's "Every module" block."""
    after = (ROOT / "docs" / "design.md").read_text().split("\n## Every module\n", 1)[1]
    block = after.split("```\n", 2)[1]
    return set(re.findall(r"^(\S+\.py)\s", block, flags=re.M))


def test_design_lists_every_module_of_the_package() -> None:
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.name not in NOT_MODULES}
    assert sorted(modules - _listed()) == []
