"""Generated in-memory data of the model-parallel benchmarks (seeded, with class structure).

* :func:`cifar_like`: CIFAR-10-shaped images (3x32x32, 10 classes) for Marques' network:
  each class has its own mean colour and an oriented grating of its own frequency, under
  pixel noise, so a CNN learns it and accuracy figures mean something.
* :func:`multimodal_like`: co-registered SAR-like (2 channels) + optical-like (10 channels)
  patches of 7 classes for the two-branch fusion model; some classes differ mainly in the
  SAR channels and others mainly in the optical ones, so both branches carry information.

Every rank of a benchmark builds the same tensors from the same seed; nothing is read from
disk, so the benchmark measures the model, not the loader.
"""

from __future__ import annotations

import math

import torch

__all__ = ["cifar_like", "multimodal_like"]

# Class signatures come from this fixed seed, the samples from the caller's: a training and a
# validation set drawn with different seeds share their classes.
_CLASS_SEED = 20_180_412


def cifar_like(samples: int, seed: int = 0, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` images (float32, N x 3 x 32 x 32) and labels (int64) with class structure."""
    g = torch.Generator().manual_seed(seed)
    classes_g = torch.Generator().manual_seed(_CLASS_SEED)
    labels = torch.arange(samples) % classes
    labels = labels[torch.randperm(samples, generator=g)]
    colours = torch.rand(classes, 3, generator=classes_g) * 1.2 - 0.6
    angles = torch.arange(classes, dtype=torch.float32) * math.pi / classes
    freqs = 0.3 + 0.25 * (torch.arange(classes, dtype=torch.float32) % 3)
    coords = torch.arange(32, dtype=torch.float32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    phase = torch.rand(samples, generator=g) * 2 * math.pi
    a = angles[labels].view(-1, 1, 1)
    f = freqs[labels].view(-1, 1, 1)
    grating = torch.sin(f * (xx * torch.cos(a) + yy * torch.sin(a)) + phase.view(-1, 1, 1))
    images = colours[labels].view(-1, 3, 1, 1) + 0.5 * grating.unsqueeze(1)
    images = images + 0.6 * torch.randn(samples, 3, 32, 32, generator=g)
    return images.float(), labels.long()


def multimodal_like(
    samples: int,
    seed: int = 0,
    *,
    s1_channels: int = 2,
    s2_channels: int = 10,
    classes: int = 7,
    size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` stacked (SAR, optical) patches, N x (s1 + s2) x size x size, and labels.

    Classes 0..2 differ mainly in SAR backscatter level and speckle texture, classes 3..6
    mainly in optical spectrum; every class has a weak signature in both.
    """
    g = torch.Generator().manual_seed(seed)
    classes_g = torch.Generator().manual_seed(_CLASS_SEED)
    labels = torch.arange(samples) % classes
    labels = labels[torch.randperm(samples, generator=g)]
    sar_levels = torch.linspace(-1.0, 1.0, classes)[torch.randperm(classes, generator=classes_g)]
    sar_levels[3:] *= 0.2
    spectra = torch.randn(classes, s2_channels, generator=classes_g) * 0.8
    spectra[:3] *= 0.2
    coords = torch.arange(size, dtype=torch.float32)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    texture = torch.sin(0.8 * (labels.float().view(-1, 1, 1) + 1) * (xx + yy) / size * math.pi)
    speckle = torch.randn(samples, s1_channels, size, size, generator=g)
    sar = sar_levels[labels].view(-1, 1, 1, 1) + 0.3 * texture.unsqueeze(1) + 3.0 * speckle
    optical = spectra[labels].view(-1, s2_channels, 1, 1) + 3.0 * torch.randn(
        samples, s2_channels, size, size, generator=g
    )
    return torch.cat([sar, optical], dim=1).float(), labels.long()
