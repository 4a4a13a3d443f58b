"""Sphinx configuration of the jupyter-gpucr documentation (MyST Markdown, PyData theme).

Built with warnings as errors by scripts/test.sh: ``python -m sphinx -W --keep-going -b html docs OUT``.
The reference pages are generated from the code: the configuration from the ``GPUCR`` traits
(autodoc-traits), the CLI from its argparse parser (sphinx-argparse), the REST API from
``docs/rest-api.yaml`` (sphinxcontrib-openapi), which tests/server/test_openapi.py checks the
handlers against.
"""
from __future__ import annotations

import sys
from pathlib import Path

from jupyter_gpucr._version import __version__

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "jupyter-gpucr"
author = "the jupyter-gpucr developers"
copyright = "the jupyter-gpucr developers, BSD-3-Clause"
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "autodoc_traits",
    "sphinxarg.ext",
    "sphinxcontrib.openapi",
    "schema_table",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
# Links between pages are checked at build time: a missing page or anchor is a warning, hence an error.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
nitpicky = False
suppress_warnings: list[str] = []

html_theme = "pydata_sphinx_theme"
html_title = f"jupyter-gpucr {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
}
html_static_path: list[str] = []
