"""The docs site, built once per test session (tests/unit/test_docs.py checks the build,
tests/unit/test_docs_layout.py the built pages).

``python -m sphinx -W --keep-going -b html docs OUT``: warnings are errors, nothing is fetched
(no intersphinx; the theme's assets are in its wheel). ~25 s on 2 idle cores.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]


@dataclass(frozen=True)
class BuiltSite:
    """The outcome of one build: its exit status, its output, and the HTML folder."""

    returncode: int
    output: str
    html: Path


@functools.cache
def built_site() -> BuiltSite:
    """Build the site into a temporary folder (removed at exit); the same one afterwards."""
    out = Path(tempfile.mkdtemp(prefix="rh_docs_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    proc = subprocess.run(
        [*SPHINX, str(DOCS), str(out / "html")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    return BuiltSite(proc.returncode, proc.stderr or proc.stdout, out / "html")
