"""Tests for raytrain_hetero.app.config: models, YAML loading, error messages, overrides."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from raytrain_hetero.app.config import (
    DataConfig,
    JobConfig,
    check_data_root,
    dump_config,
    load_config,
    merge_overrides,
    parse_override,
    parse_overrides,
    validate_config,
)
from raytrain_hetero.config import (
    BackendConfig,
    ConfigProblem,
    PolicyConfig,
    SlowdownInjection,
    WorkerSpec,
)
from raytrain_hetero.errors import ConfigError, DataError, HeteroError
from raytrain_hetero.workloads.registry import GenerateOptions

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"

MINIMAL = {"data": {"root": "data/x"}, "workers": [{"name": "a"}, {"name": "b"}]}


def write_yaml(tmp_path: Path, data: object, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def example_data() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def load_with(tmp_path: Path, mutate) -> JobConfig:
    data = example_data()
    mutate(data)
    return load_config(write_yaml(tmp_path, data))


# ------------------------------------------------------------------------------ valid configs


def test_example_config_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cfg = load_config(EXAMPLE)
    assert cfg.name == "eurosat-local"
    assert cfg.data.root == REPO / "data" / "eurosat_synth"
    assert cfg.data.root.is_absolute()
    assert cfg.data.generate == GenerateOptions(samples_per_class=100)
    assert cfg.data.bands == "all"
    assert cfg.model.name == "small_cnn" and cfg.model.width == 32
    assert (cfg.train.epochs, cfg.train.global_batch_size, cfg.train.lr) == (4, 192, 0.05)
    assert [w.name for w in cfg.workers] == ["fast", "medium", "slow"]
    assert [w.emulated_slowdown for w in cfg.workers] == [1.0, 2.0, 4.0]
    assert all(w.resources == {"CPU": 1.0} and w.resolved_device() == "cpu" for w in cfg.workers)
    assert cfg.ray.num_cpus == 4 and cfg.ray.address is None
    assert cfg.output_dir == Path("outputs/eurosat_local")
    assert cfg.total_workers == 3


def test_minimal_config_defaults() -> None:
    cfg = validate_config(MINIMAL)
    assert cfg.name == "raytrain-hetero"
    assert cfg.train.epochs == 3 and cfg.train.global_batch_size == 192
    assert cfg.train.weighting == "proportional" and cfg.train.fixed_shares is None
    assert cfg.probe.warmup == 2 and cfg.probe.repeats == 3 and cfg.probe.batch_sizes is None
    assert cfg.workers[0].resources == {"CPU": 1.0}
    assert cfg.workers[0].device == "auto" and cfg.workers[0].resolved_device() == "cpu"
    assert cfg.ray.dashboard_host == "127.0.0.1"
    assert cfg.output_dir == Path("outputs/run")


def test_root_resolved_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert DataConfig(root="rel/dir").root == tmp_path / "rel" / "dir"
    assert DataConfig(root="/abs/dir").root == Path("/abs/dir")


def test_expanded_workers_and_total() -> None:
    cfg = validate_config(
        {
            "data": {"root": "x"},
            "workers": [{"name": "gpu", "count": 2, "max_batch": 64}, {"name": "cpu"}],
            "train": {"fixed_shares": [2, 2, 1]},
        }
    )
    assert cfg.total_workers == 3
    expanded = cfg.expanded_workers()
    assert [w.name for w in expanded] == ["gpu-0", "gpu-1", "cpu"]
    assert all(w.count == 1 for w in expanded)
    assert expanded[0].max_batch == 64


def test_resolved_device() -> None:
    assert WorkerSpec(name="a").resolved_device() == "cpu"
    assert WorkerSpec(name="a", resources={"CPU": 2, "GPU": 1}).resolved_device() == "cuda"
    gpu = {"CPU": 1, "GPU": 1}
    assert WorkerSpec(name="a", resources=gpu, device="cpu").resolved_device() == "cpu"
    assert WorkerSpec(name="a", resources=gpu, device="cuda").resolved_device() == "cuda"


def test_band_list_accepted() -> None:
    assert DataConfig(root="x", bands=["B04", "B03", "B02"]).bands == ["B04", "B03", "B02"]
    assert DataConfig(root="x", bands="rgb").bands == "rgb"


def test_configs_are_frozen() -> None:
    cfg = validate_config(MINIMAL)
    with pytest.raises(ValidationError):
        cfg.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.train.epochs = 10  # type: ignore[misc]
    with pytest.raises(ValidationError):
        cfg.workers[0].count = 5  # type: ignore[misc]


# ------------------------------------------------------------------------------ unknown keys


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, {**MINIMAL, "epochs": 3})
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.count("\n") == 0  # one problem, one line
    assert msg.startswith(f"{path}: epochs: unknown key 'epochs' at the top level")
    valid = msg.split("valid keys: ")[1].split(".")[0].split(", ")
    assert {
        "name",
        "data",
        "model",
        "train",
        "probe",
        "workers",
        "ray",
        "scheduler",
        "elastic",
        "output_dir",
    } <= set(valid)
    assert "Fix:" in msg
    assert "Traceback" not in msg and "pydantic" not in msg


def test_ghost_batchnorm_from_yaml(tmp_path: Path) -> None:
    """train.batchnorm: ghost with train.ghost_size reaches the library's BatchConfig; a
    global batch that is not whole groups is one error naming both values."""
    cfg = load_with(tmp_path, lambda d: d["train"].update(batchnorm="ghost", ghost_size=32))
    batch = cfg.train.batch()
    assert (batch.batchnorm, batch.ghost_size, batch.slice_quantum) == ("ghost", 32, 32)
    with pytest.raises(ConfigError) as info:
        load_with(tmp_path, lambda d: d["train"].update(batchnorm="ghost", ghost_size=50))
    (problem,) = info.value.problems
    assert problem.path == "train.ghost_size"
    assert "global_batch_size 192 is not a multiple of ghost_size 50" in str(info.value)


def test_unknown_nested_key_suggests_closest(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_with(tmp_path, lambda d: d["train"].update({"learning_rate": 0.1}))
    msg = str(info.value)
    assert "train.learning_rate: unknown key 'learning_rate' under 'train'" in msg
    assert (
        "valid keys: global_batch_size, min_slice, weighting, batchnorm, ghost_size, "
        "max_memory_fraction, memory_cap_mode, fixed_shares, seed, step_workers, epochs, lr, "
        "momentum, weight_decay" in msg
    )
    assert "Fix: rename it to 'lr'" in msg
    (problem,) = info.value.problems
    assert problem.path == "train.learning_rate"


@pytest.mark.parametrize(
    ("section", "typo", "expected"),
    [
        ("train", "epoch", "epochs"),
        ("train", "globl_batch_size", "global_batch_size"),
        ("data", "rooot", "root"),
        ("model", "widht", "width"),
    ],
)
def test_unknown_key_suggestions(section: str, typo: str, expected: str) -> None:
    data = {**MINIMAL, section: {**MINIMAL.get(section, {}), typo: 1}}
    with pytest.raises(ConfigError, match=rf"Fix: rename it to '{expected}'"):
        validate_config(data)


def test_unknown_key_in_worker_lists_worker_fields() -> None:
    data = {**MINIMAL, "workers": [{"name": "a", "slowdown": 2}]}
    with pytest.raises(ConfigError) as info:
        validate_config(data, source="cfg.yaml")
    msg = str(info.value)
    assert "cfg.yaml: workers[0].slowdown: unknown key 'slowdown' under 'workers[0]'" in msg
    assert "emulated_slowdown" in msg and "rename it to 'emulated_slowdown'" in msg


# ------------------------------------------------------------------------------ invalid values


def test_negative_epochs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_with(tmp_path, lambda d: d["train"].update({"epochs": -2}))
    msg = str(info.value)
    assert "train.epochs: must be >= 1, got -2" in msg and "Fix: use a value >= 1" in msg


def test_slowdown_below_one() -> None:
    data = {**MINIMAL, "workers": [{"name": "a", "emulated_slowdown": 0.5}]}
    with pytest.raises(ConfigError, match=r"workers\[0\]\.emulated_slowdown: must be >= 1"):
        validate_config(data)


def test_cuda_without_gpu() -> None:
    data = {**MINIMAL, "workers": [{"name": "g", "device": "cuda"}]}
    with pytest.raises(ConfigError) as info:
        validate_config(data)
    msg = str(info.value)
    assert "workers[0].device" in msg and "cuda" in msg
    assert "resources: {GPU: 1}" in msg


def test_fractional_gpu_for_cuda_rejected() -> None:
    half = {"name": "g", "device": "cuda", "resources": {"CPU": 1, "GPU": 0.5}}
    with pytest.raises(ConfigError, match="share"):
        validate_config({**MINIMAL, "workers": [half]})
    # auto resolves to cuda when a GPU is requested, so the same rule applies
    with pytest.raises(ConfigError, match=r"workers\[0\]\.resources\.GPU: .*fractional"):
        auto = {"name": "g", "resources": {"CPU": 1, "GPU": 0.2}}
        validate_config({**MINIMAL, "workers": [auto]})


def test_worker_needs_cpu() -> None:
    with pytest.raises(ConfigError, match="CPU > 0"):
        validate_config({**MINIMAL, "workers": [{"name": "g", "resources": {"GPU": 1}}]})


def test_fixed_shares_length_names_needed_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_with(tmp_path, lambda d: d["train"].update({"fixed_shares": [1.0, 2.0]}))
    msg = str(info.value)
    assert "train.fixed_shares" in msg
    assert "has 2 entries" in msg and "3 shares are needed" in msg
    assert "fast, medium, slow" in msg


def test_fixed_shares_counts_expanded_workers() -> None:
    data = {
        "data": {"root": "x"},
        "workers": [{"name": "a", "count": 3}],
        "train": {"fixed_shares": [1]},
    }
    with pytest.raises(ConfigError, match="3 shares are needed"):
        validate_config(data)


def test_batch_too_small_for_workers() -> None:
    data = {**MINIMAL, "train": {"global_batch_size": 3, "min_slice": 2}}
    with pytest.raises(ConfigError, match=r"train\.global_batch_size: .* at least 4"):
        validate_config(data)


def test_max_batch_caps_too_small() -> None:
    data = {
        "data": {"root": "x"},
        "workers": [{"name": "a", "max_batch": 50}, {"name": "b", "count": 2, "max_batch": 40}],
        "train": {"global_batch_size": 192},
    }
    with pytest.raises(ConfigError, match=r"sum of count x max_batch = 130"):
        validate_config(data)
    data["workers"][1]["max_batch"] = 71
    assert validate_config(data).total_workers == 3


def test_max_micro_batch_caps_slices_only_in_slice_mode() -> None:
    data = {
        "data": {"root": "x"},
        "workers": [{"name": "a", "max_micro_batch": 50}, {"name": "b", "max_batch": 40}],
        "train": {"global_batch_size": 192, "memory_cap_mode": "slice"},
    }
    with pytest.raises(ConfigError, match=r"max_batch and max_micro_batch = 90"):
        validate_config(data)
    data["workers"][0]["max_micro_batch"] = 1
    data["train"]["min_slice"] = 2
    with pytest.raises(ConfigError, match=r"workers\[0\]\.max_micro_batch: 1 is below"):
        validate_config(data)
    # Accumulation keeps the speed share: a pass cap does not cap the slice.
    data["train"]["memory_cap_mode"] = "accumulate"
    data["workers"][1]["max_batch"] = 190
    assert validate_config(data).train.memory_cap_mode == "accumulate"


def test_duplicate_worker_names() -> None:
    with pytest.raises(ConfigError, match=r"workers\[1\]\.name: duplicate worker name 'a'"):
        validate_config({**MINIMAL, "workers": [{"name": "a"}, {"name": "a"}]})


def test_wrong_type_names_expected_and_given() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({**MINIMAL, "train": {"epochs": "many", "lr": True}})
    msg = str(info.value)
    assert "train.epochs: expected an integer, got 'many'" in msg
    assert "train.lr: expected a number, got true" in msg


def test_every_problem_in_one_error() -> None:
    data = {
        "data": {"root": "x", "bands": "rgbb"},
        "workers": [{"name": "a", "device": "gpu"}],
        "train": {"epochs": 0, "momentum": 1.5},
        "typo": 1,
    }
    with pytest.raises(ConfigError) as info:
        validate_config(data, source="job.yaml")
    problems = info.value.problems
    paths = {p.path for p in problems}
    assert paths == {"data.bands", "workers[0].device", "train.epochs", "train.momentum", "typo"}
    lines = str(info.value).splitlines()
    assert lines[0] == "5 problems in job.yaml:"
    assert all(line.strip().startswith("job.yaml: ") and ". Fix: " in line for line in lines[1:])
    assert "use bands: rgb" in str(info.value) and "use 'cuda'" in str(info.value)


def test_missing_required_sections() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({"name": "x"}, source="j.yaml")
    msg = str(info.value)
    assert "j.yaml: data: required key 'data' is missing" in msg
    assert "j.yaml: workers: required key 'workers' is missing" in msg


def test_config_error_pickles_with_problems() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({**MINIMAL, "train": {"epochs": -1}})
    err = pickle.loads(pickle.dumps(info.value))
    assert isinstance(err, ConfigError)
    assert isinstance(err, HeteroError) and isinstance(err, ValueError)
    assert str(err) == str(info.value)
    assert err.problems == info.value.problems
    assert isinstance(err.problems[0], ConfigProblem)


# ------------------------------------------------------------------------------ files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert str(path) in msg and "not found" in msg and "Fix:" in msg


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_yaml(tmp_path: Path, text: str) -> None:
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match="top level must be a mapping") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_empty_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is empty"):
        load_config(write_yaml(tmp_path, ""))


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "train: {epochs: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert str(path) in str(info.value) and "line" in str(info.value)


def test_duplicate_yaml_keys_rejected(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "train:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(ConfigError, match="duplicate key 'lr'"):
        load_config(path)


def test_dump_config_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    cfg = load_config(EXAMPLE)
    out = dump_config(cfg, tmp_path / "sub" / "resolved.yaml")
    assert load_config(out) == cfg
    assert [p.name for p in out.parent.iterdir()] == ["resolved.yaml"]


# ------------------------------------------------------------------------------ data root


def test_check_data_root_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(DataError) as info:
        check_data_root(DataConfig(root=missing))
    msg = str(info.value)
    assert str(missing) in msg
    assert "data.generate: {}" in msg and "downloaded EuroSAT" in msg


def test_check_data_root_ok(tmp_path: Path) -> None:
    check_data_root(DataConfig(root=tmp_path))  # exists
    check_data_root(DataConfig(root=tmp_path / "new", generate={}))  # will be generated


def test_check_data_root_file(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DataError, match="not a directory"):
        check_data_root(DataConfig(root=f, generate={}))


# ------------------------------------------------------------------------------ overrides


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("train.epochs=1", {"train": {"epochs": 1}}),
        ("train.lr=0.1", {"train": {"lr": 0.1}}),
        ("name=my-run", {"name": "my-run"}),
        ("data.generate={}", {"data": {"generate": {}}}),
        ("ray.address=null", {"ray": {"address": None}}),
        ("probe.batch_sizes=[8, 32]", {"probe": {"batch_sizes": [8, 32]}}),
        ("model.pretrained=true", {"model": {"pretrained": True}}),
        ("name=a=b", {"name": "a=b"}),
        ("workers.0.emulated_slowdown=2", {"workers": {"0": {"emulated_slowdown": 2}}}),
    ],
)
def test_parse_override(text: str, expected: dict) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["train.epochs", "=1", "train..epochs=1", "name=[a"])
def test_parse_override_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="Fix:"):
        parse_override(text)


def test_merge_overrides_is_deep_and_pure() -> None:
    base = {"train": {"epochs": 4, "lr": 0.05}, "workers": [{"name": "a"}, {"name": "b"}]}
    over = parse_overrides(["train.epochs=1", "workers.1.emulated_slowdown=3", "name=x"])
    merged = merge_overrides(base, over)
    assert merged == {
        "train": {"epochs": 1, "lr": 0.05},
        "workers": [{"name": "a"}, {"name": "b", "emulated_slowdown": 3}],
        "name": "x",
    }
    assert base == {"train": {"epochs": 4, "lr": 0.05}, "workers": [{"name": "a"}, {"name": "b"}]}


def test_merge_overrides_keeps_dotted_keys_and_merges_list_items() -> None:
    merged = merge_overrides(
        {"tune": None, "workers": [{"name": "a", "count": 2}]},
        {
            "tune": {"search_space": {"train.lr": {"choice": [0.1]}}},
            "workers": {"-1": {"emulated_slowdown": 2}},
        },
    )
    assert merged["tune"] == {"search_space": {"train.lr": {"choice": [0.1]}}}
    assert merged["workers"] == [{"name": "a", "count": 2, "emulated_slowdown": 2}]


def test_merge_overrides_bad_index() -> None:
    with pytest.raises(ConfigError, match="out of range"):
        merge_overrides({"workers": [{"name": "a"}]}, {"workers": {"3": {"count": 2}}})
    with pytest.raises(ConfigError, match="item index"):
        merge_overrides({"workers": [{"name": "a"}]}, {"workers": {"x": 1}})


def test_load_config_with_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    overrides = parse_overrides(
        ["train.epochs=1", "workers.2.emulated_slowdown=8", "ray.num_cpus=2"]
    )
    cfg = load_config(EXAMPLE, overrides)
    assert cfg.train.epochs == 1 and cfg.train.lr == 0.05
    assert [w.emulated_slowdown for w in cfg.workers] == [1.0, 2.0, 8.0]
    assert cfg.ray.num_cpus == 2


def test_load_config_bad_override_reports_file_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, parse_overrides(["train.epochs=-1"]))
    msg = str(info.value)
    assert str(EXAMPLE) in msg and "train.epochs: must be >= 1" in msg and "overrides" in msg


def test_scheduler_elastic_emulation_backend_sections(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        {
            **MINIMAL,
            "scheduler": {
                "policy": {"window_steps": 4, "straggler_penalty": 5.0},
                "plan_sync_every": 3,
                "flush_every": 2,
            },
            "emulation": {"slowdowns": [{"factor": 3, "worker": "b", "from_step": 10}]},
            "elastic": {"min_workers": 1},
            "backend": {"torch_backend": "gloo", "collective_timeout_s": 60},
        },
    )
    cfg = load_config(path)
    assert cfg.scheduler.policy == PolicyConfig(window_steps=4, straggler_penalty=5.0)
    assert (cfg.scheduler.plan_sync_every, cfg.scheduler.flush_every) == (3, 2)
    assert cfg.emulation.slowdowns[0] == SlowdownInjection(factor=3, worker="b", from_step=10)
    assert cfg.elastic.min_workers == 1
    assert cfg.backend == BackendConfig(torch_backend="gloo", collective_timeout_s=60)
    bad = write_yaml(tmp_path, {**MINIMAL, "emulation": {"slowdowns": [{"factor": 3}]}})
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert "emulation.slowdowns[0]" in str(info.value) and "worker" in str(info.value)


def test_run_sections_are_checked_against_the_workers(tmp_path: Path) -> None:
    # The same cross-checks as HeteroTrainer's, at the YAML keys.
    with pytest.raises(ConfigError) as info:
        validate_config(
            {
                **MINIMAL,
                "elastic": {"min_workers": 3},
                "emulation": {
                    "slowdowns": [{"factor": 2, "worker": "zz"}, {"factor": 2, "rank": 5}]
                },
            }
        )
    msg = str(info.value)
    assert "3 problems" in msg
    assert "elastic.min_workers: 3 is more than the 2 worker slots" in msg
    assert "emulation.slowdowns[0].worker: names worker 'zz'" in msg
    assert "emulation.slowdowns[1].rank: rank 5 is outside 0..1" in msg
    with pytest.raises(ConfigError, match=r"scheduler\.policy\.window_steps: expected a number"):
        validate_config({**MINIMAL, "scheduler": {"policy": {"window_steps": True}}})
    with pytest.raises(ConfigError, match="rename it to 'window_steps'"):
        validate_config({**MINIMAL, "scheduler": {"policy": {"window_step": 3}}})


def test_pre_0_2_scheduler_keys_are_unknown_keys(tmp_path: Path) -> None:
    # The policy's knobs live in scheduler.policy, injected slowdowns in emulation.slowdowns.
    for key, value in (("window_steps", 4), ("slowdown_schedule", [{"factor": 3}])):
        path = write_yaml(tmp_path, {**MINIMAL, "scheduler": {key: value}})
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert f"scheduler.{key}" in str(info.value)


def test_ghost_batchnorm_run_settings_name_the_groups() -> None:
    """Too few whole groups for the workers, a micro-batch cap under one group, and a
    model-parallel mode: each refused by name with its fix."""
    from raytrain_hetero.config import (
        BatchConfig,
        ElasticConfig,
        EmulationConfig,
        ParallelConfig,
        WorkerSpec,
        run_setting_problems,
    )

    ghost = BatchConfig(global_batch_size=64, batchnorm="ghost", ghost_size=32)
    workers = [WorkerSpec(name="a", count=3, max_micro_batch=16)]
    problems = run_setting_problems(workers, ghost, ElasticConfig(), EmulationConfig())
    text = " | ".join(message for _, message, _ in problems)
    assert "3 workers x a smallest slice of 32" in text
    assert "16 is below ghost_size 32" in text
    parallel = ParallelConfig(mode="branches")
    problems = run_setting_problems(
        [WorkerSpec(name="a", count=2)],
        ghost,
        ElasticConfig(),
        EmulationConfig(),
        parallel=parallel,
    )
    assert any("'ghost' with parallel.mode 'branches'" in message for _, message, _ in problems)
