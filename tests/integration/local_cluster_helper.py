"""Loads ``deploy/local/local_cluster.py`` (a script, not a package module) for the tests."""

from __future__ import annotations

import importlib.util
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
