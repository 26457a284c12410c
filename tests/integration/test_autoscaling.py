"""Autoscaling end to end: ``scripts/autoscaling_demo.py`` under Ray's fake multinode provider.

Too slow for every CI run (2-4 minutes on 2 cores: nodes are launched, and Ray Train notices
them only after its autoscaling coordinator's ~20 s refresh), so it runs only when asked:

    RAYTRAIN_HETERO_AUTOSCALING_TEST=1 python -m pytest tests/integration/test_autoscaling.py

The demo starts its own head (own process session, private temp dir) and stops it through
that process group; it never touches another Ray instance.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("RAYTRAIN_HETERO_AUTOSCALING_TEST") != "1",
        reason="slow: set RAYTRAIN_HETERO_AUTOSCALING_TEST=1 (or run scripts/autoscaling_demo.py)",
    ),
]


def test_autoscaler_adds_tagged_nodes_and_the_worker_group_grows(tmp_path):
    state = Path(os.path.join("/tmp", f"rh-as-{os.getpid()}"))  # short: Ray's socket paths
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "autoscaling_demo.py"), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "RESULT: the worker group grew" in out
    assert re.search(r"joined, labels \{'pool': 'fast'\}", out)
    assert re.search(r"joined, labels \{'pool': 'slow'\}", out)
    # Ray Train's own decisions: it started with the one worker the head holds, then grew.
    sizes = [int(n) for n in re.findall(r"Started training worker group of size (\d+)", out)]
    assert sizes[0] == 1 and sizes[-1] == 3 and sizes == sorted(sizes), sizes
    assert re.search(r"Deciding to resize the worker group from 1 -> [23] workers", out)
    assert re.search(r"cluster stopped \(\d+ process\(es\) needed SIGKILL, 0 left\)", out)
