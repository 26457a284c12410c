"""Models: ResNets for any band count, 3-D CNN, fusion CNN, offline-only pretrained weights."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import timm
import torch

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads import (
    SpectralSpatial3DCNN,
    TwoBranchFusionCNN,
    build_model,
    check_input_channels,
    expected_input_channels,
)
from raytrain_hetero.workloads.models import pretrained_weights_path


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
@pytest.mark.parametrize("bands", [2, 13, 103])
def test_resnets_take_any_number_of_bands(name: str, bands: int) -> None:
    model = build_model(name, in_channels=bands, num_classes=7)
    assert model(torch.randn(2, bands, 32, 32)).shape == (2, 7)
    assert expected_input_channels(model) == bands


def test_3d_cnn_convolves_over_bands_and_pixels() -> None:
    model = build_model("cnn3d", in_channels=30, num_classes=5, width=4)
    assert isinstance(model, SpectralSpatial3DCNN)
    assert any(isinstance(m, torch.nn.Conv3d) for m in model.modules())
    x = torch.randn(3, 30, 7, 7, requires_grad=True)
    out = model(x)
    assert out.shape == (3, 5)
    out.sum().backward()
    assert x.grad.abs().sum(dim=(0, 2, 3)).gt(0).all()  # every band influences the output
    assert model(torch.randn(2, 30, 1, 1)).shape == (2, 5)  # also purely spectral (1x1 patches)
    assert expected_input_channels(model) == 30
    with pytest.raises(ConfigError, match=">= 4 spectral bands"):
        build_model("cnn3d", in_channels=3, num_classes=5)


def test_fusion_branches_see_only_their_modality() -> None:
    fused = build_model("fusion_cnn", in_channels=12, num_classes=7, width=8, s1_channels=2)
    sar = build_model(
        "fusion_cnn", in_channels=12, num_classes=7, width=8, s1_channels=2, modalities=("s1",)
    )
    assert isinstance(fused, TwoBranchFusionCNN) and set(fused.branches) == {"s1", "s2"}
    assert set(sar.branches) == {"s1"}
    x = torch.randn(4, 12, 16, 16, requires_grad=True)
    sar(x).sum().backward()
    assert x.grad[:, :2].abs().sum() > 0 and x.grad[:, 2:].abs().sum() == 0
    x.grad = None
    fused(x).sum().backward()
    assert x.grad[:, :2].abs().sum() > 0 and x.grad[:, 2:].abs().sum() > 0
    with pytest.raises(ConfigError, match="s1_channels"):
        build_model("fusion_cnn", in_channels=12, num_classes=7)
    with pytest.raises(ConfigError, match="modalities"):
        build_model("fusion_cnn", in_channels=12, num_classes=7, s1_channels=2, modalities=("sar",))


def test_pretrained_true_is_refused_and_uncached_weights_fail_fast(
    tmp_path: Path, monkeypatch
) -> None:
    with pytest.raises(ConfigError, match="cannot be downloaded"):
        build_model("resnet50", in_channels=13, num_classes=10, pretrained=True)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    started = time.perf_counter()
    with pytest.raises(
        ConfigError, match=r"not in the local cache.*resnet18_sentinel2_all_moco.*copy it to"
    ):
        build_model(
            "resnet18",
            in_channels=13,
            num_classes=10,
            pretrained="ResNet18_Weights.SENTINEL2_ALL_MOCO",
        )
    assert time.perf_counter() - started < 10  # no network attempt, no hang
    with pytest.raises(ConfigError, match="unknown torchgeo weights"):
        build_model("resnet18", in_channels=13, num_classes=10, pretrained="ResNet18_Weights.NOPE")
    with pytest.raises(
        DataError, match="band-count mismatch: weights .* expect 13 input bands but the data has 3"
    ):
        build_model(
            "resnet18",
            in_channels=3,
            num_classes=10,
            pretrained="ResNet18_Weights.SENTINEL2_ALL_MOCO",
        )


def test_cached_pretrained_weights_are_loaded_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    _, path = pretrained_weights_path("ResNet18_Weights.SENTINEL2_ALL_MOCO")
    assert path.startswith(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    torch.manual_seed(1)
    source = timm.create_model(
        "resnet18", in_chans=13, num_classes=0
    )  # backbone, like the real file
    torch.save(source.state_dict(), path)
    model = build_model(
        "resnet18", in_channels=13, num_classes=10, pretrained="ResNet18_Weights.SENTINEL2_ALL_MOCO"
    )
    assert torch.equal(model.conv1.weight, source.conv1.weight)
    assert model.fc.out_features == 10
    Path(path).write_bytes(b"truncated")
    with pytest.raises(DataError, match="cannot load pretrained weights"):
        build_model(
            "resnet18",
            in_channels=13,
            num_classes=10,
            pretrained="ResNet18_Weights.SENTINEL2_ALL_MOCO",
        )


def test_band_count_check_names_both_counts() -> None:
    model = build_model("small_cnn", in_channels=13, num_classes=10)
    check_input_channels(model, 13, source="x")
    with pytest.raises(
        DataError,
        match=r"band-count mismatch: /data/uc has 3 band\(s\) per sample but the model takes 13",
    ):
        check_input_channels(model, 3, source="/data/uc")
