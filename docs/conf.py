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
    "sphinx_copybutton",
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

# The PyData theme, as Ray's docs use: the site's sections in the top bar, the current
# section's pages on the left, "On this page" on the right, previous/next at each page's end.
# docs/_static/custom.css widens the article so that code and tables show whole at 1,400 px
# (tests/unit/test_docs_layout.py checks every code block against that width).
html_theme = "pydata_sphinx_theme"
html_title = "raytrain_hetero"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "logo": {"text": "raytrain_hetero"},
    "navbar_align": "left",
    "header_links_before_dropdown": 8,
    "navbar_end": ["theme-switcher"],
    "secondary_sidebar_items": ["page-toc"],
    "show_toc_level": 2,
    "show_prev_next": True,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": [],
    "pygments_light_style": "tango",
    "pygments_dark_style": "monokai",
}
html_sidebars = {"index": []}  # the landing page: full width, its contents are the top bar
html_show_sourcelink = False

# sphinx-copybutton: copy a block without its prompts (``$ ``, ``>>> ``) or outputs.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = False

# Keep "--set" and "--resume" as typed (no en dashes in CLI text).
smartquotes = False
