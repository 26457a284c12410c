"""Dataset registry: name -> adapter, DataSource reading, clear errors for unknown names."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads import registry
from raytrain_hetero.workloads.data import bad_files, generate_dataset, open_datasets
from raytrain_hetero.workloads.registry import (
    DatasetAdapter,
    DataSource,
    GenerateOptions,
    WorkloadData,
    dataset_adapter,
    dataset_names,
    register_dataset,
)

BUILTIN = ("eurosat", "hyperspectral", "multimodal", "uc_merced")


def test_builtins_are_registered_under_their_names() -> None:
    assert set(BUILTIN) <= set(dataset_names())
    for name in BUILTIN:
        adapter = dataset_adapter(name)
        assert adapter.name == name and adapter.title
        assert set(adapter.generate_keys) <= set(GenerateOptions.model_fields)


def test_unknown_dataset_lists_the_registered_names() -> None:
    with pytest.raises(ConfigError) as info:
        dataset_adapter("eurosta")
    message = str(info.value)
    assert "'eurosta'" in message
    for name in BUILTIN:
        assert name in message
    with pytest.raises(ConfigError):
        open_datasets(DataSource("eurosta", Path("/nonexistent")))


def test_a_registered_adapter_is_used_by_the_generic_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # stays in this test
    calls: list[tuple[str, ...]] = []

    def open_(source: DataSource, splits: tuple[str, ...], exclude: list[str]) -> WorkloadData:
        calls.append(splits)
        return WorkloadData({s: list(range(5)) for s in splits}, 2, 4)

    def generate(source: DataSource) -> Path:
        source.root.mkdir()
        return source.root

    register_dataset(
        DatasetAdapter(
            name="toy_for_test",
            title="toy",
            generate=generate,
            open=open_,
            default_on_bad_file=None,
        )
    )
    assert "toy_for_test" in dataset_names()
    source = DataSource("toy_for_test", tmp_path / "toy", generate=GenerateOptions())
    assert generate_dataset(source) == tmp_path / "toy"
    workload = open_datasets(source, ("train", "val"))
    assert calls == [("train", "val")] and workload.num_classes == 2
    assert bad_files(source) == []  # no scan_files: nothing to check


def test_eurosat_through_the_registry(tmp_path: Path) -> None:
    pytest.importorskip("torchgeo")
    source = DataSource(
        "eurosat",
        tmp_path / "eurosat",
        bands="rgb",
        generate=GenerateOptions(samples_per_class=3, size=16),
    )
    generate_dataset(source)
    workload = open_datasets(source, ("train", "val"))
    assert workload.in_channels == 3 == dataset_adapter("eurosat").expected_bands(source)
    assert workload.num_classes == 10 and len(workload.class_names) == 10
    assert workload.datasets["train"][0]["image"].shape == (3, 16, 16)
    # An on_bad_file check runs through the adapter's file scan (all files readable here).
    checked = DataSource("eurosat", source.root, on_bad_file="error")
    assert bad_files(checked) == []


def test_hyperspectral_has_no_per_file_check(tmp_path: Path) -> None:
    # A scene is checked when read: asking for a bad-file check must not scan other layouts.
    source = DataSource("hyperspectral", tmp_path / "missing", on_bad_file="error")
    assert bad_files(source) == []
