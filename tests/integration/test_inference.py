"""Distributed inference: Ray Data actor pools with batch sizes proportional to measured speed."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import rasterio
import torch
import yaml

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.datasets import (
    generate_configured_dataset,
    model_arguments,
    open_configured_datasets,
)
from raytrain_hetero.app.predict import run_predict
from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.errors import DataError
from raytrain_hetero.inference.predict import plan_actor_pools
from raytrain_hetero.workloads import build_model

SCENE = {"height": 24, "width": 28, "spectral_bands": 12, "classes": 4}


def scene_job(tmp_path: Path, slowdowns=(1.0, 3.0)) -> dict:
    return {
        "name": "predict-test",
        "data": {
            "dataset": "hyperspectral",
            "root": str(tmp_path / "scene"),
            "generate": SCENE,
            "hyperspectral": {"patch_size": 3, "block_size": 8},
        },
        "model": {"name": "cnn3d", "width": 4},
        "workers": [
            {"name": "fast", "resources": {"CPU": 1}, "emulated_slowdown": slowdowns[0]},
            {"name": "slow", "resources": {"CPU": 1}, "emulated_slowdown": slowdowns[1]},
        ],
        "ray": {"num_cpus": 3},
        "output_dir": str(tmp_path / "out"),
    }


def save_checkpoint(
    job: JobConfig, path: Path, *, train_steps: int = 0, meta: dict | None = None
) -> Path:
    """A checkpoint in the trainer's format (a briefly trained real model)."""
    generate_configured_dataset(job.data)
    workload = open_configured_datasets(job.data, ("train",))
    torch.manual_seed(0)
    model = build_model(job.model.name, **model_arguments(job.model, workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(workload.datasets["train"], batch_size=32, shuffle=True)
    step = 0
    while step < train_steps:
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == train_steps:
                break
    if meta is None:
        meta = {
            "dataset": job.data.dataset,
            "in_channels": workload.in_channels,
            "num_classes": workload.num_classes,
        }
    path.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "meta": meta},
        path / "model.pt",
    )
    return path


def test_plan_sizes_batches_and_shares_by_speed() -> None:
    specs = [WorkerSpec(name="gpu", count=2), WorkerSpec(name="cpu", count=1)]
    plan = plan_actor_pools(specs, [300.0, 100.0], total=1000, batch_size=90, mode="proportional")
    assert [(p.worker, p.batch_size, p.samples) for p in plan] == [
        ("gpu", 90, 857),
        ("cpu", 30, 143),
    ]
    # Every actor then runs about the same number of batches: 857/2/90 ~ 143/30 ~ 4.8.
    equal = plan_actor_pools(specs, [300.0, 100.0], total=1000, batch_size=90, mode="equal")
    assert [(p.batch_size, p.samples) for p in equal] == [(90, 667), (90, 333)]
    single = plan_actor_pools(specs, [300.0, 100.0], total=1000, batch_size=90, mode="single")
    assert [(p.worker, p.count, p.samples) for p in single] == [("gpu", 1, 1000)]


@pytest.mark.ray
def test_cli_predicts_a_scene_with_proportional_batches(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # Runs before the module's shared Ray: the CLI starts (and stops) its own.
    monkeypatch.chdir(tmp_path)
    raw = scene_job(tmp_path)
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(raw))
    job = JobConfig.model_validate(raw)
    checkpoint = save_checkpoint(job, tmp_path / "ckpt", train_steps=30)
    out = tmp_path / "pred"
    code = main(
        [
            "predict",
            "--config",
            str(config),
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(out),
            "--batch-size",
            "64",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "predict (proportional)" in printed and "samples/s" in printed
    table = pq.read_table(out / "predictions").to_pandas()
    assert len(table) == 24 * 28 and sorted(table["index"]) == list(range(24 * 28))
    assert set(table["worker"]) == {"fast", "slow"}
    summary = yaml.safe_load((out / "predict_summary.json").read_text())
    assert summary["source"] == "files"
    plan = {p["worker"]: p for p in summary["plan"]}
    # Emulated slowdown 3: the slow pool measures slower and gets smaller batches and share.
    assert plan["fast"]["measured_samples_per_s"] > 1.5 * plan["slow"]["measured_samples_per_s"]
    assert plan["fast"]["batch_size"] == 64 > plan["slow"]["batch_size"]
    assert plan["fast"]["samples"] > plan["slow"]["samples"]
    for name, rows in table.groupby("worker"):
        assert set(rows["batch_size"]) <= {
            plan[name]["batch_size"],
            *range(1, plan[name]["batch_size"]),
        }
    with rasterio.open(out / "class_map.tif") as src:
        class_map = src.read(1)
    assert class_map.shape == (24, 28) and class_map.min() >= 1 and class_map.max() <= 4
    labelled = table[table["label"] >= 0]
    assert summary["accuracy_on_labelled"] == pytest.approx(
        float((labelled["prediction"] == labelled["label"]).mean())
    )
    assert summary["accuracy_on_labelled"] > 0.4  # 30 steps of training, 4 classes


@pytest.mark.ray
def test_single_actor_baseline_on_a_test_split(ray_local, tmp_path: Path) -> None:
    # The equal plan runs through the same code as the proportional one (plans: see above).
    raw = {
        "data": {
            "dataset": "multimodal",
            "root": str(tmp_path / "mm"),
            "generate": {"samples_per_class": 10, "size": 16},
        },
        "model": {"name": "fusion_cnn", "width": 8},
        "workers": [{"name": "a", "resources": {"CPU": 1}}, {"name": "b", "resources": {"CPU": 1}}],
    }
    job = JobConfig.model_validate(raw)
    checkpoint = save_checkpoint(job, tmp_path / "ckpt")
    single = run_predict(
        job,
        checkpoint,
        output_dir=tmp_path / "one",
        mode="single",
        batch_size=4,
        speeds=[10.0, 50.0],
        quiet=True,
    )
    assert single["split"] == "test" and single["samples"] == 14
    assert [(p["worker"], p["actors"], p["samples"]) for p in single["plan"]] == [("b", 1, 14)]
    assert single["workers"][0]["batches"] == 4 and single["samples_per_s"] > 0
    table = pq.read_table(tmp_path / "one" / "predictions").to_pandas()
    assert sorted(table["index"]) == list(range(14)) and table["sample_id"].str.contains("/").all()
    assert set(table["worker"]) == {"b"} and table["confidence"].between(0, 1).all()


def test_checkpoint_problems_stop_before_any_actor(tmp_path: Path) -> None:
    job = JobConfig.model_validate(scene_job(tmp_path))
    wrong_bands = save_checkpoint(
        job, tmp_path / "wrong", meta={"in_channels": 200, "num_classes": 4}
    )
    with pytest.raises(
        DataError, match=r"band-count mismatch: .*trained on 200 band\(s\) .* data has 12"
    ):
        run_predict(job, wrong_bands, output_dir=tmp_path / "o")
    # Without recorded metadata the first layer's shape gives the mismatch away.
    raw = scene_job(tmp_path)
    raw["model"] = {"name": "small_cnn", "width": 8}
    small = JobConfig.model_validate(raw)
    state = build_model("small_cnn", in_channels=20, num_classes=4, width=8).state_dict()
    (tmp_path / "bare").mkdir()
    torch.save(state, tmp_path / "bare" / "model.pt")
    with pytest.raises(DataError, match=r"trained on 20 input band\(s\) \(layer features.0.weight"):
        run_predict(small, tmp_path / "bare", output_dir=tmp_path / "o")
    corrupt = tmp_path / "corrupt" / "model.pt"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DataError, match=rf"{corrupt}: cannot load the checkpoint"):
        run_predict(job, corrupt, output_dir=tmp_path / "o")
    with pytest.raises(DataError, match="no checkpoint at .*checkpoint_\\*/model.pt"):
        run_predict(job, tmp_path / "nowhere", output_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()
