"""Sphinx configuration of the raytrain_hetero docs (MyST markdown, as Ray and torchgeo use).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``. Nothing is fetched
at build time (no intersphinx): the build works offline, in CI and in the tests
(``tests/unit/test_docs.py``). The configuration and CLI references are generated from the
code by our own extension, ``docs/_ext/rh_docs.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
# The package of this checkout, not an installed copy elsewhere.
sys.path.insert(0, str(DOCS.parent))

project = "raytrain_hetero"
author = "raytrain_hetero contributors"
copyright = "2026, raytrain_hetero contributors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "rh_docs",
    "rh_api",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: heading anchors for in-page links (`page.md#a-heading`), ::: fences, $math$ off.
myst_heading_anchors = 6
myst_enable_extensions = ["colon_fence", "deflist"]
# `../benchmarks/results/...` and `../examples/...` links are files of the repository, not
# pages: MyST turns them into downloads; only genuinely missing targets warn.
# performance.md's tables of results jump heading levels (H1 -> H3) on purpose.
suppress_warnings = ["myst.header"]

# Every Python cross-reference must resolve: a ``raytrain_hetero.*`` target that is not in
# the code (renamed, removed) fails the build; rh_docs accepts real ones without a page and
# leaves third-party targets unchecked (no intersphinx: the build is offline).
nitpicky = True

# autodoc: the public API from docstrings (Google style via napoleon). Attributes as field
# lists, not object entries, so a class documented twice never clashes.
autodoc_member_order = "bysource"
# "On this page" lists an API page's entries as ``fit()``, not ``HeteroTrainer.fit()``.
toc_object_entries_show_parents = "hide"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

html_theme = "alabaster"
html_title = "raytrain_hetero"
html_static_path: list[str] = []
html_theme_options = {"description": "Heterogeneity-aware, exact data parallelism on Ray Train"}

# Keep "--set" and "--resume" as typed (no en dashes in CLI text).
smartquotes = False
