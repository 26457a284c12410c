"""app/datasets.py: the YAML data section -> the library DataSource."""

from __future__ import annotations

from pathlib import Path

from raytrain_hetero.app.datasets import data_source
from raytrain_hetero.app.sections import DataConfig
from raytrain_hetero.workloads.registry import GenerateOptions, SceneOptions


def test_every_section_field_reaches_the_library_options() -> None:
    data = DataConfig.model_validate(
        {
            "dataset": "hyperspectral",
            "root": "/tmp/scene",
            "hyperspectral": {
                "image": "a.mat",
                "labels": "b.mat",
                "image_key": "cube",
                "label_key": "gt",
                "patch_size": 7,
                "split": "random",
                "block_size": 8,
                "guard": False,
                "fractions": [0.5, 0.25, 0.25],
            },
            "generate": {
                "seed": 3,
                "height": 20,
                "width": 24,
                "spectral_bands": 10,
                "classes": 4,
                "file_format": "tif",
            },
        }
    )
    source = data_source(data)
    assert source.root == Path("/tmp/scene")
    assert source.scene == SceneOptions(
        image="a.mat",
        labels="b.mat",
        image_key="cube",
        label_key="gt",
        patch_size=7,
        split="random",
        block_size=8,
        guard=False,
        fractions=(0.5, 0.25, 0.25),
    )
    assert source.generate == GenerateOptions(
        seed=3, height=20, width=24, spectral_bands=10, classes=4, file_format="tif"
    )


def test_absent_sections_stay_none_and_generate_fields_carry() -> None:
    plain = data_source(DataConfig.model_validate({"dataset": "eurosat", "root": "/tmp/e"}))
    assert plain.scene is None and plain.generate is None
    gen = data_source(
        DataConfig.model_validate(
            {"dataset": "multimodal", "root": "/tmp/m", "generate": {"cloud_fraction": 0.3}}
        )
    ).generate
    assert gen == GenerateOptions(cloud_fraction=0.3)
