"""``raytrain-hetero train`` in the model-parallel modes, from the example configs.

* conv_split (examples/configs/conv_split_local.yaml): the per-rank kernels replace the slice
  in the worker table and summary.json; its full-model checkpoint resumes in data mode
  (``--run-name X --resume --set parallel.mode=data``) and the run continues.
* branches (examples/configs/branches_local.yaml): the placement in summary.json, bytes per
  step; ``raytrain-hetero predict`` loads its checkpoint unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.outputs import read_metrics_csv

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
TINY = ["--set", "train.epochs=1", "--set", "data.generate.samples_per_class=20"]


def kernels_of(text: str) -> dict[str, int]:
    return {name: int(k) for name, k in (part.split(":") for part in text.split())}


@pytest.mark.ray
def test_conv_split_trains_from_its_example_and_resumes_in_data_mode(
    ray_local, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    config = CONFIGS / "conv_split_local.yaml"
    out = tmp_path / "out"
    common = ["train", str(config), "--output", str(out), "--run-name", "cs", *TINY]
    session = ray_local.get_runtime_context().gcs_address
    assert main([*common, "--set", "data.generate.size=16"]) == 0
    # The CLI trained on the caller's Ray and left it running (its embedded Ray it stops).
    assert ray_local.is_initialized()
    assert ray_local.get_runtime_context().gcs_address == session
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    parallel = summary["parallel"]
    assert parallel["mode"] == "conv_split" and parallel["groups"] == [[0, 1]]
    layers = ["features.0", "features.4", "features.8"]
    split = [kernels_of(text) for text in parallel["layout"]]
    # Every split layer's kernels (width 48: 48, 96, 96) are cut over both ranks, >= 1 each.
    for name, total in zip(layers, (48, 96, 96), strict=True):
        assert split[0][name] + split[1][name] == total and min(s[name] for s in split) >= 1
    assert parallel["bytes_per_step"] > 0
    # The worker table shows each rank's kernels instead of its slice.
    header = next(line for line in printed.splitlines() if line.startswith("rank"))
    assert "kernels" in header and "slice" not in header
    assert parallel["layout"][0] in printed and parallel["layout"][1] in printed
    steps = summary["steps"]
    # The checkpoint is the plain single-device model's (what data mode and predict load).
    from raytrain_hetero.inference.checkpoints import find_checkpoint_file, load_checkpoint
    from raytrain_hetero.workloads.models import SmallCNN

    state, meta = load_checkpoint(find_checkpoint_file(out))
    assert meta["parallel_mode"] == "conv_split"
    plain = SmallCNN(13, 10, width=48)
    plain.load_state_dict(state)  # strict: every key, full shapes
    full = torch.load(find_checkpoint_file(out), weights_only=True)["optimizer"]
    assert len(full["param_groups"][0]["params"]) == len(list(plain.parameters()))

    # The same name again without --resume is refused (before any Ray starts).
    capsys.readouterr()
    assert main([*common, "--set", "data.generate.size=16"]) == 2
    assert "--resume" in capsys.readouterr().err
    # Resume the same run data-parallel for a second epoch.
    resumed = [
        *common,
        "--resume",
        "--no-progress",
        "--set",
        "train.epochs=2",
        "--set",
        "parallel.mode=data",
        "--set",
        "parallel.layers=[]",
        "--set",
        "data.generate.size=16",
    ]
    assert main(resumed) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["resumed"] and summary["run"]["first_step"] == steps
    assert summary["steps"] == 2 * steps
    assert summary["parallel"]["mode"] == "data" and summary["parallel"]["layout"] is None
    rows = read_metrics_csv(out / "metrics.csv")
    assert sorted({r["step"] for r in rows}) == list(range(2 * steps))
    assert 0.0 <= summary["final_val_accuracy"] <= 1.0


@pytest.mark.ray
def test_branches_trains_from_its_example_and_predict_loads_the_checkpoint(
    ray_local, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    config = CONFIGS / "branches_local.yaml"
    out = tmp_path / "out"
    assert main(["train", str(config), "--output", str(out), "--no-progress", *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    parallel = summary["parallel"]
    assert parallel["mode"] == "branches" and parallel["micro_batches"] == 4
    # One branch per rank, the head on one of them: {"s1", "s2+head"} in some order.
    assert sorted(parallel["layout"]) in (["s1", "s2+head"], ["s1+head", "s2"])
    assert parallel["bytes_per_step"] > 0
    capsys.readouterr()
    pred = tmp_path / "pred"
    code = main(
        [
            "predict",
            str(config),
            "--checkpoint",
            str(out),
            "--output",
            str(pred),
            "--split",
            "val",
            "--mode",
            "single",
            *TINY[2:],
        ]
    )
    assert code == 0
    assert "accuracy on" in capsys.readouterr().out
    table = pq.read_table(pred / "predictions").to_pandas()
    assert len(table) == summary["val_samples"]
