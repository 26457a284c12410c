"""Bad-input sweep through the CLI's front door: generated invalid configs and corrupt files.

Every case must end with exit status 2, one line on stderr naming the field or the file, and
nothing written (neither the output directory nor the data root).
"""

from __future__ import annotations

import copy
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.config import load_config
from raytrain_hetero.errors import HeteroError

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = yaml.safe_load(
    (REPO / "examples" / "configs" / "eurosat_local.yaml").read_text()
)
SWEEP = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

NON_FINITE = st.sampled_from([math.inf, -math.inf, math.nan])
WRONG_TYPE = st.one_of(
    st.text(alphabet="abcxyz", min_size=1, max_size=5),
    st.lists(st.integers(), min_size=1, max_size=2),
    st.booleans(),
    st.dictionaries(st.sampled_from(["k", "v"]), st.integers(), min_size=1, max_size=1),
)

#: (dotted key as the error names it, how to set it, values that are invalid there)
FIELD_CASES: list[tuple[str, tuple[Any, ...], st.SearchStrategy[Any]]] = [
    ("train.epochs", ("train", "epochs"), st.one_of(st.integers(-5, 0), WRONG_TYPE)),
    ("train.lr", ("train", "lr"), st.one_of(st.floats(-1, 0), NON_FINITE, WRONG_TYPE)),
    ("train.momentum", ("train", "momentum"), st.one_of(st.floats(1, 10), NON_FINITE)),
    ("train.weight_decay", ("train", "weight_decay"), st.one_of(st.floats(-9, -1e-9), NON_FINITE)),
    ("train.max_failures", ("train", "max_failures"), st.one_of(st.integers(-9, -1), WRONG_TYPE)),
    (
        "train.global_batch_size",
        ("train", "global_batch_size"),
        st.one_of(st.integers(-5, 2), WRONG_TYPE),
    ),
    ("probe.repeats", ("probe", "repeats"), st.one_of(st.integers(-3, 0), WRONG_TYPE)),
    (
        "backend.collective_timeout_s",
        ("backend", "collective_timeout_s"),
        st.one_of(st.integers(-100, 0), NON_FINITE, WRONG_TYPE),
    ),
    (
        "elastic.resize_monitor_interval_s",
        ("elastic", "resize_monitor_interval_s"),
        st.one_of(st.floats(-5, 0), NON_FINITE),
    ),
    ("elastic.min_workers", ("elastic", "min_workers"), st.integers(4, 50)),
    (
        "train.fixed_shares",
        ("train", "fixed_shares"),
        st.lists(st.floats(0.5, 4), min_size=1, max_size=6).filter(lambda v: len(v) != 3),
    ),
    (
        "emulation.slowdowns[0].factor",
        ("emulation", "slowdowns", 0, "factor"),
        st.one_of(st.floats(-5, 0.99), NON_FINITE),
    ),
    ("emulation.slowdowns[0].worker", ("emulation", "slowdowns", 0, "worker"), st.just("nosuch")),
    (
        "emulation.slowdowns[0].rank",
        ("emulation", "slowdowns"),
        st.integers(3, 99).map(lambda rank: [{"factor": 2, "rank": rank}]),
    ),
    ("workers[1].emulated_slowdown", ("workers", 1, "emulated_slowdown"), NON_FINITE),
    ("ray.num_cpus", ("ray", "num_cpus"), st.one_of(st.integers(-4, 0), WRONG_TYPE)),
    ("model.width", ("model", "width"), st.one_of(st.integers(-4, 0), WRONG_TYPE)),
    (
        "parallel.mode",
        ("parallel", "mode"),
        st.one_of(st.sampled_from(["model", "conv", "split", "pipeline"]), WRONG_TYPE),
    ),
    (
        "parallel.group_size",
        ("parallel", "group_size"),
        st.one_of(st.integers(-4, 0), st.text(alphabet="abc", min_size=1, max_size=3)),
    ),
    (
        "parallel.micro_batches",
        ("parallel", "micro_batches"),
        st.one_of(st.integers(-4, 0), WRONG_TYPE),
    ),
    (
        # conv_split over the three workers of the base job: groups that do not cut 3 workers
        "parallel.group_size",
        ("parallel",),
        st.sampled_from([2, 4, 5]).map(
            lambda size: {"mode": "conv_split", "layers": ["features.0"], "group_size": size}
        ),
    ),
    (
        # branch placement of a model without declared branches (small_cnn)
        "parallel.mode",
        ("parallel",),
        st.just({"mode": "branches"}),
    ),
    (
        # conv_split without layers
        "parallel.layers",
        ("parallel",),
        st.sampled_from([{"mode": "conv_split"}, {"mode": "conv_split", "layers": []}]),
    ),
]


def _set(raw: dict[str, Any], where: tuple[Any, ...], value: Any) -> None:
    node: Any = raw
    for key in where[:-1]:
        if key == "slowdowns" and "slowdowns" not in node:
            node["slowdowns"] = [{"factor": 2, "worker": "fast"}]
        elif isinstance(key, str):
            node = node.setdefault(key, {})
            continue
        node = node[key]
    node[where[-1]] = value


def _front_door(tmp: Path, text: str | bytes, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``train`` on a config with ``text``; check exit 2, one stderr line, nothing written."""
    config = tmp / "job.yaml"
    if isinstance(text, bytes):
        config.write_bytes(text)
    else:
        config.write_text(text)
    out = tmp / "out"
    capsys.readouterr()
    code = main(["train", str(config), "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("raytrain-hetero: error: ") and err.count("\n") == 1, err
    assert not out.exists()
    assert not (tmp / "data").exists()
    return err


def _base() -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["data"]["root"] = "data/eurosat_synth"  # relative: resolved under the test's cwd
    return raw


@SWEEP
@given(case=st.sampled_from(FIELD_CASES), data=st.data())
def test_invalid_values_are_refused_naming_the_field(case, data, capsys, monkeypatch):
    key, where, values = case
    value = data.draw(values, label=key)
    raw = _base()
    _set(raw, where, value)
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.chdir(tmp)
        err = _front_door(Path(tmp), yaml.safe_dump(raw), capsys)
    assert key in err, err
    assert "Fix" in err, err


@SWEEP
@given(
    section=st.sampled_from(
        ["", "train", "data", "probe", "backend", "elastic", "ray", "parallel"]
    ),
    unknown=st.from_regex(r"[a-z]{3,8}_(zz|qq)", fullmatch=True),
)
def test_unknown_keys_are_refused_naming_the_key(section, unknown, capsys, monkeypatch):
    raw = _base()
    (raw.setdefault(section, {}) if section else raw)[unknown] = 1
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.chdir(tmp)
        err = _front_door(Path(tmp), yaml.safe_dump(raw), capsys)
    assert (f"{section}.{unknown}" if section else unknown) in err, err


@SWEEP
@given(data=st.data())
def test_corrupt_config_files_are_refused_naming_the_file(data, capsys, monkeypatch):
    text = yaml.safe_dump(_base())
    kind = data.draw(st.sampled_from(["truncated", "not_a_mapping", "garbage", "tabs"]))
    if kind == "truncated":
        body: str | bytes = text[: data.draw(st.integers(0, len(text) - 1))]
    elif kind == "not_a_mapping":
        body = data.draw(st.sampled_from(["- a\n- b\n", "42\n", "just text\n", "null\n"]))
    elif kind == "garbage":
        body = data.draw(st.binary(min_size=1, max_size=64))
    else:
        body = "train:\n\tepochs: 2\n"
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.chdir(tmp)
        config = Path(tmp) / "job.yaml"
        if isinstance(body, bytes):
            config.write_bytes(body)
        else:
            config.write_text(body)
        try:
            load_config(config)
        except HeteroError:
            pass
        else:  # a prefix that happens to be a complete valid job: not a bad input
            assume(False)
        err = _front_door(Path(tmp), body, capsys)
        assert "job.yaml" in err, err


def test_corrupt_data_file_is_refused_naming_the_file(tmp_path, capsys, monkeypatch):
    from raytrain_hetero.app.datasets import data_source
    from raytrain_hetero.workloads.data import generate_dataset

    raw = _base()
    raw["data"].update(
        {"root": str(tmp_path / "eurosat"), "generate": {"samples_per_class": 3, "size": 16}}
    )
    raw["data"]["on_bad_file"] = "error"
    job = load_config_text(tmp_path, raw)
    generate_dataset(data_source(job.data))
    victim = sorted((tmp_path / "eurosat").rglob("*.tif"))[4]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated TIFF
    monkeypatch.chdir(tmp_path)
    err = _front_door(tmp_path, yaml.safe_dump(raw), capsys)
    assert victim.name in err, err


def load_config_text(tmp: Path, raw: dict[str, Any]):
    path = tmp / "valid.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _refusing_builder(in_channels: int, num_classes: int, width: int) -> Any:
    raise ValueError(f"refusing_net takes width <= 16, got {width}")


def _refusing_open(source: Any, splits: Any, exclude: Any) -> Any:
    raise FileNotFoundError(f"no manifest.csv under {source.root}")


@pytest.mark.parametrize("broken", ["model", "dataset"])
def test_an_error_of_the_users_model_or_dataset_is_one_line(broken, tmp_path, capsys, monkeypatch):
    """A registered builder or adapter raising anything ends as one line naming the setting."""
    import dataclasses

    from raytrain_hetero.workloads import registry

    raw = _base()
    raw["data"].update(
        {"root": str(tmp_path / "eurosat"), "generate": {"samples_per_class": 3, "size": 16}}
    )
    if broken == "model":
        monkeypatch.setitem(registry._MODELS, "refusing_net", _refusing_builder)
        raw["model"] = {"name": "refusing_net", "width": 32}
        expected = ("model.name refusing_net", "ValueError: refusing_net takes width <= 16")
    else:
        adapter = dataclasses.replace(
            registry.dataset_adapter("eurosat"), name="refusing_data", open=_refusing_open
        )
        monkeypatch.setitem(registry._REGISTRY, "refusing_data", adapter)
        raw["data"]["dataset"] = "refusing_data"
        expected = ("data.dataset refusing_data", "FileNotFoundError: no manifest.csv")
    monkeypatch.chdir(tmp_path)
    err = _front_door(tmp_path, yaml.safe_dump(raw), capsys)
    assert all(part in err for part in expected), err
    assert "Fix: correct " in err, err
