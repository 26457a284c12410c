"""Running the repository's code as its user runs it: a new interpreter at the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_in_repo(args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` at the repository root (importable: the repository first on the path);
    the completed process, its output captured as text, whatever its exit status."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
