"""The job resolved once: following a JobConfig from ``raytrain-hetero train`` to the trainer
passes each module once, never climbing back to a higher layer (``scripts/job_path.py``'s
trace of the CLI in this process, on the example config with a small generated EuroSAT; the
trainer is reached before Ray starts, so no Ray here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "configs" / "eurosat_local.yaml"


@pytest.fixture(scope="module")
def job_path():
    """The tool, imported from its file (``scripts/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("job_path", REPO / "scripts" / "job_path.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["job_path"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("job_path", None)


def test_the_train_path_passes_each_module_once_and_never_climbs(job_path, tmp_path: Path):
    path = job_path.follow_train_path(
        CONFIG,
        [
            f"data.root={tmp_path / 'eurosat'}",
            "data.generate.samples_per_class=3",
            "data.generate.size=16",
        ],
    )
    assert path.exit_status is None and path.reached_trainer, path.report()
    assert not path.ray_started  # the trainer is built from the resolved job before Ray
    assert path.reentries == () and path.climbs == (), path.report()
    app = "raytrain_hetero.app"
    assert path.steps[0] == f"{app}.resolved"  # the CLI hands the loaded job to the resolver
    assert path.steps[-2:] == (f"{app}.job", "raytrain_hetero.driver.trainer")
    # Each check in its own module, once: the outputs and derived values, the root, the data
    # and the model, the layout.
    for module in ("schema", "fs_checks", "datasets", "parallel_checks"):
        assert f"{app}.{module}" in path.steps


def test_the_measure_counts_climbs_and_reentries(job_path):
    # The path of `train` before the resolved job (run_job's checks, measured by the tool).
    before = [
        "app.job",
        "app.schema",
        "app.job",
        "app.datasets",
        "app.fs_checks",
        "app.datasets",
        "app.schema",
        "app.parallel_checks",
        "config.parallel",
        "app.schema",
        "config.groups",
        "app.schema",
        "config.groups",
        "app.job",
        "app.schema",
        "app.job",
        "app.schema",
        "driver.trainer",
    ]
    path = job_path.PathMap(
        calls=tuple((f"raytrain_hetero.{m}", "f") for m in before),
        reached_trainer=True,
        ray_started=True,
    )
    assert len(path.modules) == 8
    assert [(a[16:], b[16:]) for a, b in path.climbs] == [
        ("config.parallel", "app.schema"),
        ("config.groups", "app.schema"),
        ("config.groups", "app.job"),
    ]
    assert len(path.reentries) == 10
    assert "modules 8; climbs 3; re-entries 10" in path.report()
    # Consecutive calls in one module are one step; a step down is no climb.
    once = job_path.PathMap(
        calls=tuple((f"raytrain_hetero.{m}", "f") for m in ("app.a", "app.a", "driver.b")),
        reached_trainer=True,
        ray_started=False,
    )
    assert once.steps == ("raytrain_hetero.app.a", "raytrain_hetero.driver.b")
    assert once.climbs == () and once.reentries == ()
