"""The ``hetero-ghost<g>`` benchmark contenders: named group sizes become ghost BatchConfigs."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.arguments import add_arguments, scenario_options
from benchmarks.contenders import _batchnorm_setting
from benchmarks.scenarios import CONTENDERS, SCENARIOS, describe_contender, ghost_size_of
from raytrain_hetero.config import BatchConfig


def test_ghost_contenders_carry_their_group_size_into_the_batch_config():
    assert {"hetero-ghost16", "hetero-ghost32"} <= set(CONTENDERS)
    assert ghost_size_of("hetero-ghost16") == 16 and ghost_size_of("hetero-ghost") is None
    assert ghost_size_of("hetero-local") is None
    assert _batchnorm_setting("hetero-ghost32") == {"batchnorm": "ghost", "ghost_size": 32}
    assert _batchnorm_setting("hetero-local") == {"batchnorm": "local"}
    assert _batchnorm_setting("hetero") == {"batchnorm": "exact"}
    batch = BatchConfig(global_batch_size=192, **_batchnorm_setting("hetero-ghost16"))
    assert batch.slice_quantum == 16


def test_any_ghost_size_is_accepted_on_the_command_line():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    name = next(iter(SCENARIOS))
    args = parser.parse_args([name, "--contenders", "stock,hetero-ghost24"])
    options = scenario_options(SCENARIOS[name], args)
    assert options["contenders"] == ["stock", "hetero-ghost24"]
    with pytest.raises(ValueError, match="hetero-ghost<g>"):
        scenario_options(SCENARIOS[name], parser.parse_args([name, "--contenders", "ghost"]))


def test_a_ghost_size_outside_the_table_is_described_for_the_result_file():
    # The runner writes every contender's line into bench.json: hetero-ghost48 once crashed
    # there (KeyError) after the command line had accepted it.
    assert describe_contender("hetero-ghost48") == "hetero with batchnorm: ghost, groups of 48"
    assert describe_contender("hetero-ghost16") == CONTENDERS["hetero-ghost16"]
    with pytest.raises(KeyError):
        describe_contender("hetero-nosuch")


def test_slowdown_scale_is_refused_where_nothing_is_emulated():
    # homogeneous3's workers run at real speed: a scale would be silently ignored.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    real = next(n for n, s in SCENARIOS.items() if not s.emulated)
    with pytest.raises(ValueError, match="nothing to scale"):
        scenario_options(SCENARIOS[real], parser.parse_args([real, "--slowdown-scale", "3"]))
    emulated = next(n for n, s in SCENARIOS.items() if s.emulated)
    options = scenario_options(
        SCENARIOS[emulated], parser.parse_args([emulated, "--slowdown-scale", "2"])
    )
    assert options["slowdown_scale"] == 2.0
