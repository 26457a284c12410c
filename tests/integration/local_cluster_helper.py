"""Loads ``deploy/local/local_cluster.py`` (a script, not a package module) for the tests."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
LOCAL_CLUSTER_SCRIPT = REPO / "deploy" / "local" / "local_cluster.py"


def load_local_cluster() -> ModuleType:
    """The ``local_cluster`` module (``LocalCluster``, ``free_port``, ...)."""
    name = "raytrain_hetero_deploy_local_cluster"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, LOCAL_CLUSTER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def bystander(*argv: str) -> subprocess.Popen:
    """An unrelated process (not started by any cluster) whose command line holds ``argv``."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", *argv], start_new_session=True
    )


def pids_naming(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (to look for leftovers, never to signal)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return sorted(found)


def end_process(proc: subprocess.Popen) -> None:
    """Ends a process the test started, by its PID (``Popen.kill``)."""
    proc.kill()
    proc.wait(timeout=10)
