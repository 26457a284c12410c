"""The job's ``parallel:`` section: composition, load-time checks against the workers and the
model, and the driver-side check of the built model (before any Ray worker starts)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from torch import nn

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.config import merge_overrides, parse_override, validate_config
from raytrain_hetero.app.job import parallel_summary
from raytrain_hetero.app.outputs import format_worker_table
from raytrain_hetero.app.parallel_checks import check_parallel_fits_model
from raytrain_hetero.app.progress import with_layout
from raytrain_hetero.config import ParallelConfig
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.models import MarquesCNN, SmallCNN, TwoBranchFusionCNN, build_model

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
BASE: dict[str, Any] = {
    "data": {"root": "/nonexistent/data"},
    "workers": [{"name": "a"}, {"name": "b"}],
}
FUSION = {**BASE, "data": {"root": "/nonexistent/mm", "dataset": "multimodal"}}
FUSION["model"] = {"name": "fusion_cnn"}


def job(base: dict[str, Any], *overrides: str):
    data = copy.deepcopy(base)
    for text in overrides:
        data = merge_overrides(data, parse_override(text))
    return validate_config(data)


def refused(base: dict[str, Any], *overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        job(base, *overrides)
    return str(caught.value)


def test_parallel_section_is_the_library_config_and_defaults_to_data():
    default = job(BASE)
    assert isinstance(default.parallel, ParallelConfig)
    assert default.parallel == ParallelConfig()
    split = job(BASE, 'parallel={"mode": "conv_split", "layers": ["features.0", "features.4"]}')
    assert split.parallel.mode == "conv_split"
    assert split.parallel.layers == ("features.0", "features.4")
    # --set reaches every key, one at a time too.
    placed = job(FUSION, "parallel.mode=branches", "parallel.micro_batches=4")
    assert (placed.parallel.mode, placed.parallel.micro_batches) == ("branches", 4)


def test_group_size_that_does_not_cut_the_workers_is_refused_at_load_time():
    three = {**BASE, "workers": [{"name": "a", "count": 3}]}
    message = refused(
        three, 'parallel={"mode": "conv_split", "layers": ["features.0"], "group_size": 2}'
    )
    assert "parallel.group_size" in message and "3 worker" in message and "Fix" in message
    # all ranks in one group is fine for 3 workers
    assert job(three, 'parallel={"mode": "conv_split", "layers": ["features.0"]}')


def test_elastic_worker_counts_must_all_be_cut_into_groups():
    four = {**BASE, "workers": [{"name": "a", "count": 4}]}
    # One group of all ranks shrinks with the world, down to 2 ranks.
    everyone = 'parallel={"mode": "conv_split", "layers": ["features.0"]}'
    assert job(four, everyone, "elastic.min_workers=2")
    assert "the run may have 1" in refused(four, everyone, "elastic.min_workers=1")
    # Groups of 2 cannot cut a world of 3, which elastic 2..4 may start.
    pairs = 'parallel={"mode": "conv_split", "layers": ["features.0"], "group_size": 2}'
    message = refused(four, pairs, "elastic.min_workers=2")
    assert "parallel.group_size" in message and "elastic world sizes [3]" in message
    assert "elastic.min_workers" in message


def test_branch_placement_needs_a_model_with_two_declared_branches():
    message = refused(BASE, "parallel.mode=branches")
    assert "parallel.mode" in message and "small_cnn" in message and "fusion_cnn" in message
    message = refused(FUSION, "parallel.mode=branches", "model.modalities=[s2]")
    assert "one branch" in message and "model.modalities" in message
    assert job(FUSION, "parallel.mode=branches").parallel.mode == "branches"


def test_library_checks_of_the_section_reach_the_yaml_user():
    assert "parallel.layers" in refused(BASE, "parallel.mode=conv_split")
    assert "parallel.layers" in refused(BASE, "parallel.layers=[features.0]")
    assert "parallel.group_size" in refused(BASE, "parallel.group_size=2")


# ---------------------------------------------------------------- the built model (driver side)


def test_marques_cnn_is_selectable_from_yaml_with_its_width_and_split_layers():
    marques = job(
        BASE,
        "model.name=marques_cnn",
        "model.width=24",
        'parallel={"mode": "conv_split", "layers": ["conv1", "conv2"]}',
    )
    assert (marques.model.name, marques.model.width) == ("marques_cnn", 24)
    built = build_model(marques.model.name, in_channels=3, num_classes=10, width=24)
    assert isinstance(built, MarquesCNN)
    assert (built.conv1.out_channels, built.conv2.out_channels) == (24, 72)
    check_parallel_fits_model(marques.parallel, built, 2)
    assert "marques_cnn" in refused(BASE, "model.name=marques_cnn_typo")


def split(*layers: str, group_size: int | None = None) -> ParallelConfig:
    return ParallelConfig(mode="conv_split", layers=layers, group_size=group_size)


def test_layers_of_the_small_cnn_that_can_be_split_pass():
    check_parallel_fits_model(split("features.0", "features.4", "features.8"), SmallCNN(13), 2)


def test_a_missing_layer_names_the_conv_layers_and_the_closest():
    with pytest.raises(ConfigError) as caught:
        check_parallel_fits_model(split("features.40"), SmallCNN(13), 2)
    message = str(caught.value)
    assert "'features.40' not found" in message
    assert "features.0, features.4, features.8" in message
    assert "did you mean 'features.4'" in message and "Fix" in message


def test_a_layer_that_is_not_a_conv2d_is_refused():
    with pytest.raises(ConfigError, match=r"'features.1' is a BatchNorm2d, not an nn.Conv2d"):
        check_parallel_fits_model(split("features.1"), SmallCNN(13), 2)


def test_a_grouped_convolution_is_refused():
    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw = nn.Conv2d(8, 8, 3, groups=8)

    with pytest.raises(ConfigError, match=r"'dw' is a grouped or depthwise convolution"):
        check_parallel_fits_model(split("dw"), Depthwise(), 2)


def test_fewer_kernels_than_ranks_in_a_group_is_refused():
    # width 2: features.0 has 2 kernels; a group of all 3 workers needs 3.
    model = SmallCNN(13, width=2)
    check_parallel_fits_model(split("features.0"), model, 2)
    with pytest.raises(ConfigError, match=r"has 2 kernels but the split group has 3 ranks"):
        check_parallel_fits_model(split("features.0"), model, 3)
    # group_size, not the worker count, is what each layer is split over
    check_parallel_fits_model(split("features.0", group_size=2), model, 4)


def test_branch_placement_of_a_model_without_declared_branches_is_refused():
    with pytest.raises(ConfigError, match="does not declare its branches"):
        check_parallel_fits_model(ParallelConfig(mode="branches"), SmallCNN(13), 2)
    with pytest.raises(ConfigError, match="placement needs two or more"):
        check_parallel_fits_model(
            ParallelConfig(mode="branches"), TwoBranchFusionCNN(2, 10, 10, modalities=("s2",)), 2
        )
    check_parallel_fits_model(ParallelConfig(mode="branches"), TwoBranchFusionCNN(2, 10, 10), 2)


def test_a_branches_group_has_one_rank_per_branch_or_one_more_for_the_head():
    fusion = TwoBranchFusionCNN(2, 10, 10)
    placement = ParallelConfig(mode="branches")
    check_parallel_fits_model(placement, fusion, 3)  # the head alone on the third rank
    with pytest.raises(ConfigError, match=r"group of 4 rank\(s\) does not fit .* 2 or 3"):
        check_parallel_fits_model(placement, fusion, 4)
    check_parallel_fits_model(ParallelConfig(mode="branches", group_size=2), fusion, 4)


def test_a_bad_layer_stops_the_cli_before_ray_with_one_line(tmp_path, capsys, monkeypatch):
    raw = yaml.safe_load((CONFIGS / "conv_split_local.yaml").read_text())
    raw["data"]["root"] = str(tmp_path / "data")
    raw["data"]["generate"] = {"samples_per_class": 3, "size": 16}
    raw["parallel"]["layers"] = ["features.0", "classifier"]
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code = main(["train", str(config), "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("raytrain-hetero: error: ") and err.count("\n") == 1, err
    assert "'classifier' is a Linear" in err and "Fix" in err
    assert not out.exists()


# ---------------------------------------------------------------- outputs


def test_worker_table_shows_each_ranks_share_of_the_model_instead_of_its_slice():
    rows = [
        {"rank": 0, "worker": "fast", "device": "cpu", "samples_per_s": 90.0, "slice": 40},
        {"rank": 1, "worker": "slow", "device": "cpu", "samples_per_s": 45.0, "slice": 20},
    ]
    table = format_worker_table(
        with_layout(rows, ["conv1:120 conv2:360", "conv1:60 conv2:180"]), "kernels"
    )
    header, _, first, second = table.splitlines()
    assert "kernels" in header and "slice" not in header
    assert "conv1:120 conv2:360" in first and "conv1:60 conv2:180" in second
    assert "slice" in format_worker_table(rows)


def test_summary_parallel_part_comes_from_rank_zeros_report():
    conv = job(BASE, 'parallel={"mode": "conv_split", "layers": ["features.0"]}')
    final = {
        "hetero/groups": [[0, 1]],
        "hetero/layout": ["features.0:20", "features.0:12"],
        "hetero/resplits": 1,
        "hetero/bytes_per_step": 12345,
    }
    summary = parallel_summary(conv, final)
    assert summary["mode"] == "conv_split" and summary["layers"] == ["features.0"]
    assert summary["groups"] == [[0, 1]] and summary["layout"][1] == "features.0:12"
    assert summary["resplits"] == 1 and summary["bytes_per_step"] == 12345
    data = parallel_summary(job(BASE), {"hetero/bytes_per_step": 10})
    assert data["mode"] == "data" and data["layout"] is None and data["bytes_per_step"] == 10
