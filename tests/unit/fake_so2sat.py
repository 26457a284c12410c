"""Test data: a small synthetic So2Sat LCZ42 (version 2) in the real HDF5 layout.

Imported by bare name (pytest puts tests/unit on ``sys.path``); it lives with the tests
because no user-facing command generates So2Sat roots (``data.generate`` of the multimodal
dataset writes the GeoTIFF-pair layout instead).

The real dataset is tens of gigabytes; this generator writes a few hundred patches in exactly
the files and arrays ``torchgeo.datasets.So2Sat(root, version="2")`` reads, so the project's
So2Sat path (:func:`raytrain_hetero.workloads.multimodal.multimodal_datasets` on a root that
holds ``training.h5``) runs end to end without the download::

    root/
      .raytrain_hetero_generated.json   marker: generator parameters (written last)
      training.h5                       one file per split, each with three float64 arrays:
      validation.h5                       sen1   (N, 32, 32, 8)   Sentinel-1, So2Sat's channels
      testing.h5                          sen2   (N, 32, 32, 10)  Sentinel-2 reflectance (DN/1e4)
                                          label  (N, 17)          one-hot over So2Sat.classes

Sentinel-1 channels follow So2Sat: real and imaginary parts of the unfiltered VH and VV
single-look complex signal, the Lee-filtered VH and VV intensities, and the real and imaginary
parts of the filtered VH·conj(VV) covariance. Sentinel-2 holds So2Sat's ten bands (B02 B03 B04
B05 B06 B07 B08 B8A B11 B12).

The scenes come from the same class models as the generated two-modality data
(:func:`raytrain_hetero.workloads.synthetic.multimodal.generate_multimodal`): seven of the seventeen
Local Climate Zones, each placed at its So2Sat label (:data:`SO2SAT_LABELS`), so the classes
are learnable and a model sees So2Sat's 17-way label space. The other ten labels get no sample.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.formats import MULTIMODAL_CLASSES, SO2SAT_FILES
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
)
from raytrain_hetero.workloads.synthetic.multimodal import add_clouds, class_scenes, optical_dn

__all__ = ["SO2SAT_CLASSES", "SO2SAT_FILES", "SO2SAT_LABELS", "generate_so2sat"]

logger = logging.getLogger(__name__)

#: torchgeo's ``So2Sat.classes`` (label i is SO2SAT_CLASSES[i]), copied so that generating
#: needs neither torch nor torchgeo.
SO2SAT_CLASSES: tuple[str, ...] = (
    "Compact high rise", "Compact mid rise", "Compact low rise", "Open high rise",
    "Open mid rise", "Open low rise", "Lightweight low rise", "Large low rise", "Sparsely built",
    "Heavy industry", "Dense trees", "Scattered trees", "Bush, scrub", "Low plants",
    "Bare rock or paved", "Bare soil or sand", "Water",
)  # fmt: skip
#: So2Sat label of each generated class model.
SO2SAT_LABELS: dict[str, int] = {
    "BareSoil": SO2SAT_CLASSES.index("Bare soil or sand"),
    "CompactUrban": SO2SAT_CLASSES.index("Compact mid rise"),
    "DenseTrees": SO2SAT_CLASSES.index("Dense trees"),
    "HeavyIndustry": SO2SAT_CLASSES.index("Heavy industry"),
    "LowPlants": SO2SAT_CLASSES.index("Low plants"),
    "SparselyBuilt": SO2SAT_CLASSES.index("Sparsely built"),
    "Water": SO2SAT_CLASSES.index("Water"),
}
_SPLITS = tuple(SO2SAT_FILES)  # train, validation, test
_PATCH = 32  # So2Sat's patch side, fixed by the format
_GENERATOR_VERSION = 2
_VV_VH_COHERENCE = 0.3  # correlation of the VV and VH complex signals


def _local_mean(field: np.ndarray, window: int = 5) -> np.ndarray:
    """Mean of (n, S, S) over a window x window neighbourhood (edges replicated): the Lee
    filter's local mean, which is what the filter returns on homogeneous ground."""
    from scipy.ndimage import uniform_filter

    return uniform_filter(field, size=(1, window, window), mode="nearest")


def _sentinel1_channels(sigma0: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """So2Sat's eight Sentinel-1 channels (n, 8, S, S) from linear (VV, VH) backscatter.

    Single-look complex signals with circular Gaussian speckle (VV and VH partly coherent),
    then the filtered intensities and covariance.
    """
    n, _, s, _ = sigma0.shape
    shape = (n, s, s)
    a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2)
    b = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) / np.sqrt(2)
    vv = np.sqrt(sigma0[:, 0]) * a
    vh = np.sqrt(sigma0[:, 1]) * (_VV_VH_COHERENCE * a + np.sqrt(1 - _VV_VH_COHERENCE**2) * b)
    cov = _local_mean(vh * np.conj(vv))
    channels = (
        vh.real, vh.imag, vv.real, vv.imag,
        _local_mean(np.abs(vh) ** 2), _local_mean(np.abs(vv) ** 2),
        cov.real, cov.imag,
    )  # fmt: skip
    return np.stack(channels, axis=1)


def _check_args(
    samples_per_class: Any, seed: Any, cloud_fraction: Any, fractions: Any
) -> tuple[float, ...]:
    """Validate generate_so2sat's arguments (ConfigError naming the fix); the split fractions."""
    check_integers(
        "generate_so2sat", ("samples_per_class", samples_per_class, 3), ("seed", seed, 0)
    )
    if not isinstance(cloud_fraction, (int, float)) or not 0 <= cloud_fraction < 1:
        raise ConfigError(
            f"generate_so2sat: cloud_fraction must be a number in [0, 1), got {cloud_fraction!r}"
        )
    return check_split_fractions("generate_so2sat", fractions)


def generate_so2sat(
    root: str | os.PathLike[str],
    *,
    samples_per_class: int = 30,
    seed: int = 0,
    cloud_fraction: float = 0.0,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Path:
    """Write a synthetic So2Sat version 2 root (``training.h5``, ``validation.h5``,
    ``testing.h5``); return it.

    Written once and cached: the tree is built in a temporary sibling and renamed into place
    (:func:`~raytrain_hetero.workloads.generated_tree.generate_tree`), and a directory that
    holds a real So2Sat copy (no generator marker) is never touched.

    Args:
        root: Target directory.
        samples_per_class: Patches per generated class over the three splits (>= 3).
        seed: Generator seed (deterministic output).
        cloud_fraction: Fraction of Sentinel-2 patches under thick cloud, in [0, 1). The real
            So2Sat patches come from cloud-free composites, hence the default 0.
        split_fractions: Train/validation/test fractions per class.

    Returns:
        ``root`` as an absolute path.

    Raises:
        ConfigError: Invalid arguments.
        DataError: ``root`` is a file or a non-empty directory not made by a generator.
    """
    fr = _check_args(samples_per_class, seed, cloud_fraction, split_fractions)
    spc = int(samples_per_class)
    # Plain round(): a split may round to 0 here (an error), never silently up to 1.
    n_val, n_test = (round(f * spc) for f in fr[1:])
    per_split = dict(zip(_SPLITS, (spc - n_val - n_test, n_val, n_test), strict=True))
    if min(per_split.values()) < 1:
        raise ConfigError(
            f"generate_so2sat: samples_per_class={spc} leaves a split empty ({per_split}); "
            "raise samples_per_class"
        )
    params = {
        "generator": "fake_so2sat",
        "version": _GENERATOR_VERSION,
        "samples_per_class": spc,
        "seed": int(seed),
        "cloud_fraction": float(cloud_fraction),
        "split_fractions": list(fr),
    }

    def write(tmp: Path) -> None:
        import h5py

        for split_index, (split, n) in enumerate(per_split.items()):
            sen1, sen2, labels = [], [], []
            for class_index, cls in enumerate(MULTIMODAL_CLASSES):
                rng = np.random.default_rng([int(seed), class_index, split_index])
                s2, sigma0 = class_scenes(cls, rng, n, _PATCH)
                add_clouds(rng, s2, cloud_fraction)
                s2_dn = optical_dn(s2, rng)
                sen1.append(_sentinel1_channels(sigma0.astype(np.float64), rng))
                sen2.append(s2_dn.astype(np.float64) / 10_000)
                labels.append(np.full(n, SO2SAT_LABELS[cls]))
            order = np.random.default_rng([int(seed), 99, split_index]).permutation(
                n * len(MULTIMODAL_CLASSES)
            )  # classes interleaved, as in the real files
            label = np.concatenate(labels)[order]
            with h5py.File(tmp / SO2SAT_FILES[split], "w") as f:
                # So2Sat stores (N, H, W, C) float64; torchgeo moves channels first itself.
                f.create_dataset("sen1", data=np.concatenate(sen1)[order].transpose(0, 2, 3, 1))
                f.create_dataset("sen2", data=np.concatenate(sen2)[order].transpose(0, 2, 3, 1))
                f.create_dataset("label", data=np.eye(len(SO2SAT_CLASSES))[label])
            logger.debug("generate_so2sat: %s holds %d patches", SO2SAT_FILES[split], len(label))

    return generate_tree(root, params, write, what="generate_so2sat")
