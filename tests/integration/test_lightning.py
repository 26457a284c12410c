"""torchgeo's Lightning tasks on HeteroTrainer through the YAML job (one Ray session).

1. ``model.task: torchgeo.ClassificationTask`` with ``data.datamodule:
   torchgeo.EuroSATDataModule`` on a generated EuroSAT, 3 workers with uneven slices 5/3/2:
   every step's records carry those slices, the report carries torchgeo's validation
   accuracy, and a second submission resumes from the run's checkpoint (Lightning's
   ``checkpoint.ckpt`` + the sampler cursor) exactly at the next epoch's first step.
2. The example config ``torchgeo_segmentation_local.yaml`` (SemanticSegmentationTask on a
   generated GeoTIFF scene + mask read by torchgeo's RasterDataset) trains, and ``predict``
   writes a GeoTIFF class map with the scene's CRS and transform.
3. torchgeo's ``L7IrishDataModule`` (a GeoDataModule: an IntersectionDataset of image and
   mask rasters, RandomBatchGeoSampler boxes), unmodified, from Python on 3 probed workers,
   with a plan switch and a worker killed mid-epoch: every epoch's ``length`` draws are
   carved across the ranks exactly once, and the restarted group repeats the killed epoch
   with the very same boxes in every step (split by the plan it re-made).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raytrain_hetero.app.config import JobConfig, load_config
from raytrain_hetero.app.job import run_job
from raytrain_hetero.app.outputs import read_metrics_csv
from raytrain_hetero.app.predict import run_predict
from raytrain_hetero.config import FaultInjectionConfig, WorkerSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/configs/torchgeo_segmentation_local.yaml"
SLICES = [5, 3, 2]
WORKERS = [{"name": n, "resources": {"CPU": 1}} for n in ("fast", "mid", "slow")]


def _classification_job(tmp_path: Path, epochs: int) -> JobConfig:
    return JobConfig.model_validate(
        {
            "name": "lightning-eurosat",
            "data": {
                "dataset": "eurosat",
                "root": str(tmp_path / "eurosat"),
                "generate": {"samples_per_class": 3, "size": 16},
                "datamodule": "torchgeo.EuroSATDataModule",
                "datamodule_args": {"bands": ["B02", "B03", "B04", "B08"]},
            },
            "model": {
                "task": "torchgeo.ClassificationTask",
                "task_args": {
                    "model": "resnet18",
                    "weights": None,
                    "in_channels": 4,
                    "num_classes": 10,
                    "lr": 0.001,
                },
            },
            "train": {"epochs": epochs, "global_batch_size": 10, "fixed_shares": SLICES},
            "workers": WORKERS,
            "output_dir": str(tmp_path / "out"),
        }
    )


@pytest.mark.ray
def test_classification_task_with_eurosat_datamodule_trains_and_resumes(ray_local, tmp_path):
    first = run_job(_classification_job(tmp_path, epochs=1), progress=False)
    steps_per_epoch = first["steps"]
    assert steps_per_epoch >= 1
    rows = read_metrics_csv(tmp_path / "out/metrics.csv")
    assert {(int(r["rank"]), int(r["slice"])) for r in rows if int(r["step"]) == 0} == {
        (0, 5),
        (1, 3),
        (2, 2),
    }
    assert all(r["loss"] not in ("", None) for r in rows)
    assert 0.0 <= first["final_val_accuracy"] <= 1.0  # torchgeo's val_OverallAccuracy
    folder = Path(first["run"]["folder"])
    checkpoints = sorted(p for p in folder.glob("checkpoint_*") if p.is_dir())
    assert checkpoints and (checkpoints[-1] / "checkpoint.ckpt").is_file()
    assert (checkpoints[-1] / "raytrain_hetero_state.json").is_file()

    second = run_job(
        _classification_job(tmp_path, epochs=2),
        progress=False,
        run_name=first["run"]["name"],
        resume=True,
    )
    # Lightning and the sampler resume together: the next step is epoch 1's first.
    assert second["run"]["resumed"] and second["run"]["first_step"] == steps_per_epoch
    assert second["steps"] == 2 * steps_per_epoch


@pytest.mark.ray
def test_segmentation_example_trains_and_predicts_a_georeferenced_class_map(ray_local, tmp_path):
    import rasterio

    job = load_config(
        EXAMPLE,
        {
            "data": {"root": str(tmp_path / "scene"), "generate": {"height": 128, "width": 96}},
            "train": {"epochs": 1},
            "output_dir": str(tmp_path / "out"),
        },
    )
    summary = run_job(job, progress=False)
    assert summary["steps"] >= 1 and 0.0 <= summary["final_val_accuracy"] <= 1.0
    predicted = run_predict(job, tmp_path / "out", quiet=True)
    (scene,) = predicted["scenes"]
    with rasterio.open(tmp_path / "scene/Synthetic_pines.tif") as src:
        crs, transform, shape = src.crs, src.transform, src.shape
    with rasterio.open(scene["class_map"]) as out:
        assert out.crs == crs and out.transform == transform and out.shape == shape
        assert out.count == 1 and out.dtypes[0] == "uint8"
        assert int(out.read(1).max()) < 5
    saved = json.loads((tmp_path / "out/predict/predict_summary.json").read_text())
    assert 0.0 <= saved["scenes"][0]["pixel_accuracy"] <= 1.0


@pytest.mark.ray
def test_unmodified_geodatamodule_carves_its_draws_through_a_switch_and_a_restart(
    ray_local, tmp_path
):
    from collections import Counter

    from geo_loops import SWITCH_AFTER_STEP, SWITCHED, datamodule, geo_loop
    from ray.train import FailureConfig, RunConfig

    from raytrain_hetero import HeteroTrainer
    from raytrain_hetero.core.carving import EpochCarver
    from raytrain_hetero.core.plan import Plan
    from raytrain_hetero.worker.lightning import geo_draws
    from raytrain_hetero.worker.setup.faults import fired_markers
    from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene

    paths = str(tmp_path / "l7irish")
    generate_hyperspectral_scene(
        paths, height=48, width=48, bands=9, classes=4, file_format="l7irish"
    )
    batch, epochs, kill_after = 12, 2, 7  # 5 steps per epoch; the kill is in epoch 1
    out = tmp_path / "out"
    out.mkdir()
    trainer = HeteroTrainer(
        geo_loop,
        train_loop_config={"paths": paths, "out": str(out), "epochs": epochs},
        workers=[
            WorkerSpec(name="fast", resources={"CPU": 1}),
            WorkerSpec(name="mid", resources={"CPU": 1}, emulated_slowdown=1.5),
            WorkerSpec(name="slow", resources={"CPU": 1}, emulated_slowdown=3.0),
        ],
        batch={"global_batch_size": batch, "seed": 5},
        faults=FaultInjectionConfig(
            faults=[{"phase": "mid_epoch", "step": kill_after, "action": "kill", "rank": 1}],
            marker_dir=out / "faults",
        ),
        run_config=RunConfig(
            name="geo",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    trainer.fit()
    assert len(fired_markers(trainer.faults)) == 1
    dm = datamodule(paths)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=5)
    carver = EpochCarver(len(draws), batch, seed=5, min_step_size=3)
    switched = Plan.from_shares(batch, SWITCHED)
    attempts: dict[tuple[int, int], list[dict]] = {}
    for rank in range(3):
        for line in (out / f"ledger-{rank}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            attempts.setdefault((rank, entry["step"]), []).append(entry)
    # The killed epoch ran twice (resumed from its epoch-start checkpoint): each repeated step
    # read the same draws (the restarted group re-plans, so they may be split otherwise).
    repeated = {step for (_, step), runs in attempts.items() if len(runs) > 1}
    assert repeated == set(range(5, kill_after + 1)), sorted(repeated)
    for step in repeated:
        first, last = ([attempts[(r, step)][i]["boxes"] for r in range(3)] for i in (0, -1))
        assert sorted(b for boxes in first for b in boxes) == sorted(
            b for boxes in last for b in boxes
        )
    for (_, step), runs in attempts.items():  # before the kill, the switch held from step 2
        if SWITCH_AFTER_STEP < step <= kill_after:
            assert tuple(runs[0]["counts"]) == switched.slices and runs[0]["plan"] >= 2
    for epoch in range(epochs):
        taken: Counter = Counter()
        for k in range(carver.steps_per_epoch):
            step = epoch * carver.steps_per_epoch + k
            entries = [attempts[(rank, step)][-1] for rank in range(3)]
            counts = entries[0]["counts"]
            assert [len(e["boxes"]) for e in entries] == counts
            assert sum(counts) == carver.step_size(k)
            taken.update(tuple(b) for e in entries for b in e["boxes"])
        expected = Counter((float(q[0].start), float(q[1].start)) for q in draws.queries(epoch))
        assert taken == expected and sum(taken.values()) == dm.length == 60
