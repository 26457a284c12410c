"""Models for the remote-sensing workloads, built by name with :func:`build_model`.

Everything is built offline: no weights are ever downloaded. ``pretrained=True`` is refused
with a :class:`~raytrain_hetero.errors.ConfigError` instead of hanging on the network;
``pretrained="<torchgeo weights name>"`` (e.g. ``"ResNet18_Weights.SENTINEL2_ALL_MOCO"``)
loads those weights only from the local torch hub cache and fails at once, naming the file
to copy there, if they are absent.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.registry import BUILTIN_MODELS, model_builder, model_names

logger = logging.getLogger(__name__)

#: Built-in names of :func:`build_model` (more with :func:`~raytrain_hetero.workloads.
#: registry.register_model`).
MODEL_NAMES: tuple[str, ...] = BUILTIN_MODELS
_RESNETS = ("resnet18", "resnet50")


def _conv_bn_relu(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Module):
    """Three conv-BN-ReLU blocks with pooling, global average pool, linear classifier.

    Built to be cheap on one CPU thread for 64x64 multispectral chips while still having
    BatchNorm layers (which matter for exact uneven-slice training)::

        conv3x3(in -> w, stride 2) BN ReLU  maxpool 2   64 -> 32 -> 16 px
        conv3x3(w -> 2w)           BN ReLU  maxpool 2   16 -> 8 px
        conv3x3(2w -> 2w)          BN ReLU               8 px
        global average pool -> linear(2w -> num_classes)

    Works for any input size >= 8 px (the pooling is global at the end). Forward+backward
    of a batch of 64 13-band 64x64 chips takes ~50 ms on one CPU thread (width 32).
    """

    def __init__(self, in_channels: int = 13, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        w = width
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.features = nn.Sequential(
            *_conv_bn_relu(in_channels, w, stride=2),
            nn.MaxPool2d(2),
            *_conv_bn_relu(w, 2 * w),
            nn.MaxPool2d(2),
            *_conv_bn_relu(2 * w, 2 * w),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(2 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class SpectralSpatial3DCNN(nn.Module):
    """3-D CNN over hyperspectral patches: convolutions span bands *and* pixels.

    Input ``(B, C, k, k)`` (C bands, k x k patch) is treated as a one-channel volume
    ``(B, 1, C, k, k)``::

        conv3d 7x3x3 (1 -> w)   BN ReLU  maxpool over bands /2
        conv3d 5x3x3 (w -> 2w)  BN ReLU  maxpool over bands /2
        conv3d 3x3x3 (2w -> 2w) BN ReLU
        adaptive average pool to (4 band positions, 1, 1) -> linear(8w -> num_classes)

    Keeping four positions along the spectral axis preserves where in the spectrum a
    feature fired. Works for any band count >= 4 and any patch size >= 1.
    """

    def __init__(self, in_channels: int, num_classes: int, width: int = 8) -> None:
        super().__init__()
        w = width
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv3d(1, w, kernel_size=(7, 3, 3), padding=(3, 1, 1), bias=False),
            nn.BatchNorm3d(w),
            nn.ReLU(inplace=True),
            nn.MaxPool3d((2, 1, 1), ceil_mode=True),
            nn.Conv3d(w, 2 * w, kernel_size=(5, 3, 3), padding=(2, 1, 1), bias=False),
            nn.BatchNorm3d(2 * w),
            nn.ReLU(inplace=True),
            nn.MaxPool3d((2, 1, 1), ceil_mode=True),
            nn.Conv3d(2 * w, 2 * w, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm3d(2 * w),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool3d((4, 1, 1))
        self.classifier = nn.Linear(8 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x.unsqueeze(1))), 1))


class TwoBranchFusionCNN(nn.Module):
    """Two-modality classifier: one CNN branch per modality, late (feature-level) fusion.

    The input is the modalities stacked along channels, first ``s1_channels`` channels of
    Sentinel-1 SAR then ``s2_channels`` of Sentinel-2 (torchgeo's So2Sat sample layout).
    Each branch is :class:`SmallCNN`'s feature extractor with global average pooling; the
    pooled embeddings are concatenated and classified by a small MLP::

        x[:, :c1] -> SAR branch  -> 2w --\
                                          concat -> linear(.., 2w) ReLU dropout -> linear(K)
        x[:, c1:] -> MSI branch  -> 2w --/

    ``modalities`` selects the branches that exist: ``("s1", "s2")`` is the fusion model,
    ``("s1",)`` / ``("s2",)`` a single-branch model with the same branch and head design
    (the ablation that shows what fusion adds). A single-branch model ignores the other
    modality's channels, so every variant reads the same samples.
    """

    def __init__(
        self,
        s1_channels: int,
        s2_channels: int,
        num_classes: int,
        width: int = 32,
        modalities: Sequence[str] = ("s1", "s2"),
    ) -> None:
        super().__init__()
        mods = tuple(modalities)
        if not mods or any(m not in ("s1", "s2") for m in mods) or len(set(mods)) != len(mods):
            raise ConfigError(
                f"modalities must be a non-empty subset of ['s1', 's2'], got {list(mods)}"
            )
        self.s1_channels = s1_channels
        self.s2_channels = s2_channels
        self.in_channels = s1_channels + s2_channels
        self.num_classes = num_classes
        self.modalities = mods
        w = width
        self.branches = nn.ModuleDict(
            {
                m: nn.Sequential(
                    SmallCNN(s1_channels if m == "s1" else s2_channels, num_classes, w).features,
                    nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(),
                )
                for m in mods
            }
        )
        self.head = nn.Sequential(
            nn.Linear(2 * w * len(mods), 2 * w),
            nn.ReLU(inplace=True),
            nn.Dropout(0.2),
            nn.Linear(2 * w, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.split_inputs(x)
        embeddings = [m(part) for (_, m), part in zip(self.branch_modules(), parts, strict=True)]
        return self.head(torch.cat(embeddings, dim=1))

    # Branch placement (raytrain_hetero.parallel.DeclaresBranches): the modality branches
    # ("s1", "s2") and the head, as the model's own modules; computing through them is forward.

    def branch_modules(self) -> tuple[tuple[str, nn.Module], ...]:
        """``(modality, branch)`` in fusion order."""
        return tuple((m, self.branches[m]) for m in self.modalities)

    def fusion_head(self) -> nn.Module:
        """The MLP head over the concatenated branch embeddings."""
        return self.head

    def split_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The input's channels of each modality, in fusion order."""
        parts = {"s1": x[:, : self.s1_channels], "s2": x[:, self.s1_channels :]}
        return [parts[m] for m in self.modalities]


class MarquesCNN(nn.Module):
    """Marques, Falcão and Alexandre's CIFAR-10 CNN (Applied AI 2018): two wide conv layers.

    ``conv1`` (``width`` kernels, 5x5) -> ReLU -> 2x2 max-pool -> ``conv2`` (``3 * width``
    kernels, 5x5) -> ReLU -> 2x2 max-pool -> 2x2 average pool -> linear head. ``width=500``
    is the paper's network (500 then 1500 kernels); smaller widths keep its shape (conv2 has
    three times conv1's kernels) at a cost that fits a CPU. The two conv layers are the ones
    the conv split distributes (``conv1``, ``conv2``); :meth:`features` is everything up to
    the head, so a benchmark can time the conv layers apart from the head.
    """

    #: The layers the paper distributes (names for ``split_conv_layers``).
    SPLIT_LAYERS: tuple[str, ...] = ("conv1", "conv2")

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 500) -> None:
        super().__init__()
        self.width = width
        self.conv1 = nn.Conv2d(in_channels, width, 5, padding=2)
        self.conv2 = nn.Conv2d(width, 3 * width, 5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(3 * width * 4, num_classes)
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The conv layers (with their activations and pooling): input to the head."""
        x = self.pool(torch.relu(self.conv1(x)))
        return self.pool(torch.relu(self.conv2(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"build_model: {name} must be a positive integer, got {value!r}")
    return value


def pretrained_weights_path(weights_name: str) -> tuple[Any, str]:
    """The torchgeo weights enum named ``weights_name`` and its local hub-cache file path.

    Raises:
        ConfigError: Unknown weights name (the message lists the ResNet ones).
    """
    from torchgeo.models import get_weight

    try:
        weights = get_weight(weights_name)
    except (ValueError, KeyError, AttributeError) as exc:
        from torchgeo.models import ResNet18_Weights, ResNet50_Weights

        known = [f"ResNet18_Weights.{w.name}" for w in ResNet18_Weights][:6] + [
            f"ResNet50_Weights.{w.name}" for w in ResNet50_Weights
        ][:6]
        raise ConfigError(
            f"unknown torchgeo weights {weights_name!r} ({exc}); use a name such as "
            f"{', '.join(known)}, ..."
        ) from None
    filename = os.path.basename(urlparse(weights.url).path)
    return weights, os.path.join(torch.hub.get_dir(), "checkpoints", filename)


def _load_pretrained_resnet(
    name: str, weights_name: str, in_channels: int, num_classes: int
) -> nn.Module:
    """A torchgeo ResNet with ``weights_name`` loaded from the local cache only (no network)."""
    weights, path = pretrained_weights_path(weights_name)
    arch = weights.__class__.__name__.split("_")[0].lower()
    if arch != name:
        raise ConfigError(
            f"weights {weights_name!r} are for {arch}, but the model is {name}; "
            f"use {arch} or {name.capitalize().replace('net', 'Net')}_Weights.*"
        )
    expected = int(weights.meta["in_chans"])
    if expected != in_channels:
        raise DataError(
            f"band-count mismatch: weights {weights_name} expect {expected} input bands but the "
            f"data has {in_channels}. Fix: choose bands matching the weights (e.g. all 13 for "
            "SENTINEL2_ALL weights, rgb for RGB weights), or train without pretrained weights."
        )
    if not os.path.isfile(path):
        raise ConfigError(
            f"pretrained weights {weights_name} are not in the local cache ({path}) and cannot be "
            f"downloaded here (offline). Fix: on a machine with internet, download {weights.url} "
            f"and copy it to {path} (or set TORCH_HOME), or set pretrained: false."
        )
    from torchgeo import models

    try:  # torchgeo's own builder reads the file from the hub cache (checked above: no download)
        model = getattr(models, name)(weights=weights, num_classes=num_classes)
    except Exception as exc:  # a truncated download, weights that do not fit the architecture
        raise DataError(
            f"{path}: cannot load pretrained weights ({exc}). Fix: download it again."
        ) from exc
    logger.info("loaded pretrained %s from %s", weights_name, path)
    return model


def build_model(
    name: str,
    *,
    in_channels: int,
    num_classes: int,
    width: int = 32,
    pretrained: bool | str = False,
    s1_channels: int | None = None,
    modalities: Sequence[str] = ("s1", "s2"),
) -> nn.Module:
    """Build a classifier by name (see :data:`MODEL_NAMES`, or one added with
    :func:`~raytrain_hetero.workloads.registry.register_model`).

    ``"small_cnn"``: :class:`SmallCNN`; ``"cnn3d"``: :class:`SpectralSpatial3DCNN` (needs
    >= 4 bands); ``"fusion_cnn"``: :class:`TwoBranchFusionCNN` (``s1_channels`` of the
    ``in_channels`` are SAR, first; ``modalities`` picks the branches); ``"marques_cnn"``:
    :class:`MarquesCNN`; ``width`` is each one's base width. ``"resnet18"`` / ``"resnet50"``:
    torchgeo's ResNets (timm) for any band count (``width`` ignored); ``pretrained`` may name
    torchgeo weights (``"ResNet50_Weights.SENTINEL2_ALL_MOCO"``), read from the local hub
    cache only. A registered name: its builder(``in_channels``, ``num_classes``, ``width``).

    Raises:
        ConfigError: Unknown ``name`` (lists the valid ones), non-positive sizes,
            ``pretrained=True`` (weights cannot be downloaded on these offline machines),
            pretrained weights not in the local cache, or a bad ``s1_channels``.
        DataError: Pretrained weights made for a different band count.
    """
    builder = model_builder(name)
    if name not in MODEL_NAMES and builder is None:
        raise ConfigError(
            f"unknown model name {name!r}; valid names: {list(model_names())}. Fix: use one of "
            "them, or add yours with raytrain_hetero.workloads.registry.register_model"
        )
    in_channels = _positive_int("in_channels", in_channels)
    num_classes = _positive_int("num_classes", num_classes)
    width = _positive_int("width", width)
    if pretrained is True or (pretrained and name not in _RESNETS):
        raise ConfigError(
            f"model {name!r}: pretrained={pretrained!r} is not supported: pretrained weights cannot be "
            "downloaded (the training machines are offline and no weights are bundled). "
            "Set pretrained: false to train from random initialisation"
            + (
                ", or name torchgeo weights already in the local torch hub cache, e.g. "
                f"pretrained: {name.replace('resnet', 'ResNet')}_Weights.SENTINEL2_ALL_MOCO."
                if name in _RESNETS
                else "."
            )
        )
    if builder is not None:
        return builder(in_channels=in_channels, num_classes=num_classes, width=width)
    if name == "marques_cnn":
        return MarquesCNN(in_channels=in_channels, num_classes=num_classes, width=width)
    if name == "small_cnn":
        return SmallCNN(in_channels=in_channels, num_classes=num_classes, width=width)
    if name == "cnn3d":
        if in_channels < 4:
            raise ConfigError(f"cnn3d needs >= 4 spectral bands, got in_channels={in_channels}")
        return SpectralSpatial3DCNN(in_channels=in_channels, num_classes=num_classes, width=width)
    if name == "fusion_cnn":
        if s1_channels is None or not 0 < s1_channels < in_channels:
            raise ConfigError(
                f"fusion_cnn needs s1_channels between 1 and in_channels - 1 = {in_channels - 1} "
                f"(the SAR channels come first), got {s1_channels!r}"
            )
        return TwoBranchFusionCNN(
            s1_channels, in_channels - s1_channels, num_classes, width, modalities
        )
    if isinstance(pretrained, str) and pretrained:
        return _load_pretrained_resnet(name, pretrained, in_channels, num_classes)
    import timm

    return timm.create_model(name, pretrained=False, in_chans=in_channels, num_classes=num_classes)


def expected_input_channels(model: nn.Module) -> int | None:
    """Input channels (bands) ``model`` takes: its ``in_channels`` attribute, else the first
    convolution's, else ``None``. Unwraps DDP (``.module``)."""
    model = getattr(model, "module", model)
    value = getattr(model, "in_channels", None)
    if isinstance(value, int):
        return value
    for layer in model.modules():
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return int(layer.in_channels)
    return None


def check_input_channels(model: nn.Module, data_channels: int, *, source: str) -> None:
    """Raise a DataError if ``model`` takes a different band count than the data has.

    Args:
        model: The model (or DDP wrapper).
        data_channels: Bands of one data sample.
        source: What the data is (a path or dataset name), for the message.
    """
    expected = expected_input_channels(model)
    if expected is not None and expected != data_channels:
        raise DataError(
            f"band-count mismatch: {source} has {data_channels} band(s) per sample but the model "
            f"takes {expected}. Fix: select bands to match the model (data.bands), or build the "
            f"model for {data_channels} input channels (a checkpoint trained on other bands "
            "cannot be reused)."
        )
