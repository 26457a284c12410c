"""Models for the remote-sensing workloads: a small BatchNorm CNN and timm's ResNet-18.

Everything is built offline: no weights are ever downloaded (``pretrained=True`` is refused
with a :class:`~raytrain_hetero.errors.ConfigError` instead of hanging on the network).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from raytrain_hetero.errors import ConfigError

__all__ = ["MODEL_NAMES", "SmallCNN", "build_model"]

#: Names accepted by :func:`build_model`.
MODEL_NAMES: tuple[str, ...] = ("small_cnn", "resnet18")


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


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"build_model: {name} must be a positive integer, got {value!r}")
    return value


def build_model(
    name: str,
    *,
    in_channels: int,
    num_classes: int,
    width: int = 32,
    pretrained: bool = False,
) -> nn.Module:
    """Build a classifier by name (see :data:`MODEL_NAMES`).

    * ``"small_cnn"``: :class:`SmallCNN` (``width`` = channels of the first block).
    * ``"resnet18"``: ``timm.create_model("resnet18", in_chans=in_channels,
      num_classes=num_classes, pretrained=False)`` (``width`` is ignored).

    Raises:
        ConfigError: unknown ``name`` (lists the valid ones), non-positive sizes, or
            ``pretrained=True`` (weights cannot be downloaded on these offline machines).
    """
    if name not in MODEL_NAMES:
        raise ConfigError(f"unknown model name {name!r}; valid names: {list(MODEL_NAMES)}")
    in_channels = _positive_int("in_channels", in_channels)
    num_classes = _positive_int("num_classes", num_classes)
    width = _positive_int("width", width)
    if pretrained:
        raise ConfigError(
            f"model {name!r}: pretrained=True is not supported: pretrained weights cannot be "
            "downloaded (the training machines are offline and no weights are bundled). "
            "Set pretrained: false to train from random initialisation."
        )
    if name == "small_cnn":
        return SmallCNN(in_channels=in_channels, num_classes=num_classes, width=width)
    import timm

    return timm.create_model(
        "resnet18", pretrained=False, in_chans=in_channels, num_classes=num_classes
    )
