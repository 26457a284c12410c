"""Figures of the model-parallel benchmarks (conv-split, branches) from raw timings."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.mp_analysis import (
    branches_targets,
    conv_split_figures,
    conv_split_targets,
    crossover_delay,
    ideal_speedup,
    measured_crossover,
)
from benchmarks.mp_data import cifar_like, multimodal_like
from benchmarks.mp_suite import format_markdown
from raytrain_hetero.workloads.models import MarquesCNN, build_model


def test_ideal_speedup_is_sum_of_speeds_over_the_fastest():
    assert ideal_speedup([1.0, 2.0, 4.0]) == pytest.approx(1.75)
    assert ideal_speedup([2.0, 2.0]) == pytest.approx(2.0)


def test_crossover_delay_from_free_link_times_and_bytes():
    # Split 1 s on a free link with 100 bytes; data 1.5 s with 10 bytes: equal at 0.5/90 s/B.
    assert crossover_delay(1.0, 1.5, 100, 10) == pytest.approx(0.5 / 90)
    assert crossover_delay(1.0, 0.8, 100, 10) is None  # data parallelism always wins
    assert crossover_delay(1.0, 1.5, 10, 100) is None  # the split always wins


def test_measured_crossover_is_first_delay_where_data_wins():
    sweep = [
        {"delay_ms_per_mb": 4.0, "proportional_s": 3.0, "data_s": 2.0},
        {"delay_ms_per_mb": 0.0, "proportional_s": 1.0, "data_s": 1.5},
        {"delay_ms_per_mb": 1.0, "proportional_s": 1.6, "data_s": 1.55},
    ]
    assert measured_crossover(sweep) == 1.0
    assert measured_crossover(sweep[1:2]) is None


def _contender(name, step, conv, nbytes, kernels=None, slices=None, delay=0.0):
    return {
        "contender": name,
        "step_s": step,
        "conv_s": conv,
        "bytes_per_step": nbytes,
        "kernels": kernels or {},
        "slices": slices or [],
        "delay_ms_per_mb": delay,
    }


RUN = {
    "factors": [1.0, 2.0, 4.0],
    "width": 32,
    "measured": [
        {
            "batch": 128,
            "contenders": [
                _contender("alone", 1.75, 1.4, 0),
                _contender("equal", 1.6, 1.3, 300, {"conv1": [11, 11, 10]}),
                _contender("proportional", 1.0, 0.8, 500, {"conv1": [18, 9, 5]}),
                _contender("data", 1.1, 0.9, 100, slices=[73, 37, 18]),
            ],
        }
    ],
    "sweep": [
        {
            "batch": 128,
            "contenders": [
                _contender("proportional", 1.0, 0.8, 3_000_000, delay=0.0),
                _contender("data", 1.2, 0.9, 300_000, delay=0.0),
            ],
        },
        {
            "batch": 128,
            "contenders": [
                _contender("proportional", 1.5, 0.8, 3_000_000, delay=1.0),
                _contender("data", 1.25, 0.9, 300_000, delay=1.0),
            ],
        },
    ],
}


def test_conv_split_figures_speedups_efficiencies_and_crossover():
    figures = conv_split_figures(RUN)
    rows = {r["contender"]: r for r in figures["rows"]}
    assert rows["alone"]["speedup"] == pytest.approx(1.0)
    assert rows["proportional"]["speedup"] == pytest.approx(1.75)
    assert rows["proportional"]["efficiency"] == pytest.approx(1.0)
    assert rows["proportional"]["conv_efficiency"] == pytest.approx(1.4 / 0.8 / 1.75)
    [ratio] = figures["proportional_over_equal"]
    assert ratio["step"] == pytest.approx(1.6)
    assert figures["crossover_ms_per_mb_measured"] == 1.0
    # (1.2 - 1.0) s / ((3e6 - 3e5) / 3 workers) bytes = 2.22e-7 s/B = 222 ms/MB.
    assert figures["crossover_ms_per_mb_predicted"] == pytest.approx(0.2 / 9e5 * 1e9)

    verdicts = conv_split_targets([{"label": "hetero3", **figures}])
    by_target = {v["target"].split()[0]: v for v in verdicts}
    assert by_target["conv"]["met"] is True  # (1.4 / 0.8) / 1.75 = 1.0 >= 0.85
    assert by_target["proportional"]["met"] is True
    assert all(not v["at_paper_shapes"] for v in verdicts)


def test_markdown_names_emulation_shapes_and_verdicts():
    figures = conv_split_figures(RUN)
    result = {
        "scenario": "conv-split",
        "description": "d",
        "command": "python -m benchmarks conv-split --quick",
        "options": {"width": 32, "batches": [128], "steps": 1, "rounds": 2},
        "machine": {"cpu_model": "cpu", "usable_cpus": 2, "torch": "2", "ray": "2"},
        "note": "EMULATION: scaled down",
        "configs": [{"label": "hetero3", "raw": RUN, "figures": figures}],
        "targets": conv_split_targets([{"label": "hetero3", **figures}]),
    }
    text = format_markdown(result)
    assert "EMULATED" in text and "NOT the paper's shapes" in text
    assert "| 128 | proportional |" in text and "Crossover" in text


def test_branches_target_compares_bytes():
    run = {
        "world": 2,
        "contenders": {"branches": {"bytes_per_step": 10}, "data": {"bytes_per_step": 100}},
    }
    [verdict] = branches_targets([run])
    assert verdict["met"] and verdict["figure"] == pytest.approx(0.1)
    run["contenders"]["branches"]["bytes_per_step"] = 100
    assert not branches_targets([run])[0]["met"]


def test_marques_cnn_keeps_the_papers_shape_at_any_width():
    model = build_model("marques_cnn", in_channels=3, num_classes=10, width=8)
    assert isinstance(model, MarquesCNN)
    assert (model.conv1.out_channels, model.conv2.out_channels) == (8, 24)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    paper = MarquesCNN()
    assert (paper.conv1.out_channels, paper.conv2.out_channels) == (500, 1500)


def test_generated_data_is_seeded_and_class_structured():
    x, y = cifar_like(200, seed=1)
    again, _ = cifar_like(200, seed=1)
    assert x.shape == (200, 3, 32, 32) and torch.equal(x, again)
    assert set(y.tolist()) == set(range(10))
    # Class means differ by more than their noise would: a nearest-mean rule beats chance.
    means = torch.stack([x[y == c].mean(0) for c in range(10)])
    guess = ((x.unsqueeze(1) - means).flatten(2).pow(2).sum(2)).argmin(1)
    assert float((guess == y).float().mean()) > 0.3
    mx, my = multimodal_like(140, seed=2)
    assert mx.shape == (140, 12, 16, 16) and not math.isnan(float(mx.sum()))
    assert set(my.tolist()) == set(range(7))


def test_a_4x_speed_config_is_selectable_and_gets_the_proportional_target():
    import argparse

    from benchmarks.mp_suite import mp_options
    from benchmarks.scenarios import CONV_CONFIGS

    fields = ("width", "batches", "batch", "epochs", "steps", "rounds", "delays", "contenders")
    args = argparse.Namespace(quick=True, configs="hetero2x4", **dict.fromkeys(fields))
    assert mp_options("conv-split", args)["configs"] == ["hetero2x4"]
    factors = CONV_CONFIGS["hetero2x4"]
    assert max(factors) / min(factors) == 4
    with pytest.raises(ValueError, match="unknown --configs"):
        mp_options("conv-split", argparse.Namespace(**{**vars(args), "configs": "hetero9"}))
