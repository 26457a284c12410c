"""Synthetic co-registered Sentinel-1 / Sentinel-2 patch pairs (So2Sat-style classes).

SAR backscatter per class with speckle, optical spectra shared with the EuroSAT generator,
and clouds over a share of the optical patches; read back by
:func:`~raytrain_hetero.workloads.multimodal.multimodal_datasets`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.multimodal import (
    _S2_INDEX,
    _SPLIT_FILE,
    MULTIMODAL_CLASSES,
    MULTIMODAL_SPLITS,
    S1_BANDS,
    S2_BANDS,
)
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    split_counts,
    split_members,
)
from raytrain_hetero.workloads.synthetic.eurosat import (
    _MAT,
    _coords,
    _dots,
    _grid,
    _rectangles,
    _smooth_noise,
    _soft,
    _stripes,
)

__all__ = ["generate_multimodal"]

logger = logging.getLogger(__name__)

_GENERATOR_VERSION = 1
_CHUNK = 128

# Mean backscatter (dB) of each class: (VV, VH). Low plants and bare soil are deliberately
# close (similar roughness); built-up classes add bright point/block scatterers below.
_SIGMA0_DB: dict[str, tuple[float, float]] = {
    "BareSoil": (-12.0, -19.5),
    "CompactUrban": (-3.0, -11.0),
    "DenseTrees": (-7.5, -13.5),
    "HeavyIndustry": (-4.0, -12.5),
    "LowPlants": (-11.5, -19.0),
    "SparselyBuilt": (-8.5, -15.0),
    "Water": (-21.0, -27.5),
}


def _optical_and_radar(
    cls: str, rng: np.random.Generator, n: int, s: int
) -> tuple[np.ndarray, np.ndarray]:
    """Clean S2 (n, 10, s, s) reflectance*1e4 and S1 (n, 2, s, s) linear sigma0 of a class."""
    layers: list[tuple[str, Any]]
    bright = np.zeros((n, s, s), np.float32)  # extra SAR double-bounce (linear multiplier)
    if cls == "BareSoil":
        layers = [("soil", 1.0), ("herb", 0.4 * _soft(_smooth_noise(rng, n, s, 6.0), 1.0))]
    elif cls == "CompactUrban":
        houses, streets = _grid(rng, n, s, 4.0, 6.0, 0.7)
        layers = [("concrete", 1.0), ("roof", houses), ("asphalt", streets)]
        bright = 6.0 * houses
    elif cls == "DenseTrees":
        layers = [("shadow", 1.0), ("forest", _soft(_smooth_noise(rng, n, s, 1.5), 1.5))]
    elif cls == "HeavyIndustry":
        halls = _rectangles(rng, n, s, 4)
        layers = [("concrete", 1.0), ("roof", halls)]
        bright = 8.0 * (halls - np.roll(halls, 1, axis=2)).clip(0, 1) + 1.5 * halls
    elif cls == "LowPlants":
        layers = [("soil", 1.0), ("crop", _stripes(rng, n, s, 4.0, 8.0))]
    elif cls == "SparselyBuilt":
        houses = _dots(rng, n, s, 7.0, 10.0)
        layers = [
            ("grass", 1.0),
            ("forest", 0.4 * _soft(_smooth_noise(rng, n, s, 3.0), 1.0)),
            ("roof", houses),
        ]
        bright = 10.0 * houses
    elif cls == "Water":
        u, _ = _coords(rng, n, s)
        shore = np.clip(
            u - rng.uniform(0.7, 1.0, (n, 1, 1)) * u.max(axis=(1, 2), keepdims=True), 0, 1
        )
        layers = [("water", 1.0), ("grass", shore.astype(np.float32))]
    else:  # pragma: no cover
        raise AssertionError(cls)
    out: np.ndarray | None = None
    for name, mask in layers:
        spec = _MAT[name][_S2_INDEX][None, :] * (
            1 + 0.06 * rng.standard_normal((n, len(S2_BANDS))).astype(np.float32)
        )
        spec = spec[:, :, None, None]
        if out is None:
            out = np.broadcast_to(spec, (n, len(S2_BANDS), s, s)).copy()
            continue
        m = mask if isinstance(mask, float) else mask[:, None]
        out = out + m * (spec - out)
    assert out is not None
    vv, vh = _SIGMA0_DB[cls]
    base_db = np.array([vv, vh], np.float32)[None, :, None, None] + rng.normal(0, 1.0, (n, 1, 1, 1))
    texture = 1.5 * _smooth_noise(rng, n, s, 2.0)[:, None]  # dB-scale field-level texture
    sigma0 = 10 ** ((base_db + texture) / 10) * (1 + bright[:, None])
    return out.astype(np.float32), sigma0.astype(np.float32)


def _clouds(rng: np.random.Generator, s2: np.ndarray, fraction: float) -> np.ndarray:
    """Cover ``fraction`` of the patches with thick cloud (bright, spectrally flat) and a
    dark shadow; returns the cloudy-sample flags."""
    n, _, s, _ = s2.shape
    cloudy = rng.random(n) < fraction
    if not cloudy.any():
        return cloudy
    k = int(cloudy.sum())
    density = np.clip(0.85 + 0.6 * _smooth_noise(rng, k, s, 8.0), 0, 1)[:, None]
    cloud = rng.uniform(5000, 8000, size=(k, 1, 1, 1)).astype(np.float32)
    flat = cloud * np.linspace(1.0, 0.8, len(S2_BANDS), dtype=np.float32)[None, :, None, None]
    s2[cloudy] = s2[cloudy] * (1 - density) + flat * density
    return cloudy


def _noisy(s2: np.ndarray, s1: np.ndarray, rng: np.random.Generator, looks: float = 4.0):
    """S2: brightness jitter and pixel noise -> uint16; S1: gamma speckle -> dB float32."""
    n = s2.shape[0]
    s2 = s2 * rng.uniform(0.9, 1.1, (n, 1, 1, 1)) * (1 + 0.03 * rng.standard_normal(s2.shape))
    s2 = np.clip(np.rint(s2 + 15 * rng.standard_normal(s2.shape)), 1, 65535).astype(np.uint16)
    speckle = rng.gamma(looks, 1.0 / looks, size=s1.shape)
    s1_db = (10 * np.log10(np.maximum(s1 * speckle, 1e-5))).astype(np.float32)
    return s2, s1_db


def generate_multimodal(
    root: str | os.PathLike[str],
    *,
    samples_per_class: int = 100,
    seed: int = 0,
    size: int = 32,
    cloud_fraction: float = 0.4,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Path:
    """Write a synthetic Sentinel-1 + Sentinel-2 dataset in the documented layout; return it.

    Args:
        root: Target directory (cached and atomic; a foreign directory is never touched).
        samples_per_class: Co-registered patch pairs per class (>= 3).
        seed: Generator seed (deterministic output).
        size: Patch side in pixels (So2Sat: 32).
        cloud_fraction: Fraction of Sentinel-2 patches under thick cloud, in [0, 1).
        split_fractions: Train/val/test fractions per class.

    Raises:
        ConfigError: Invalid arguments.
        DataError: ``root`` is a file or a foreign non-empty directory.
    """
    what = "generate_multimodal"
    check_integers(what, ("samples_per_class", samples_per_class, 3), ("seed", seed, 0))
    check_integers(what, ("size", size, 16))
    if not 0 <= cloud_fraction < 1:
        raise ConfigError(
            f"generate_multimodal: cloud_fraction must be in [0, 1), got {cloud_fraction}"
        )
    fr = check_split_fractions(what, split_fractions)
    spc = int(samples_per_class)
    counts = split_counts(what, spc, fr)
    params = {
        "generator": "raytrain_hetero.workloads.multimodal",
        "version": _GENERATOR_VERSION,
        "samples_per_class": spc,
        "seed": int(seed),
        "size": int(size),
        "cloud_fraction": float(cloud_fraction),
        "split_fractions": list(fr),
    }

    def write(tmp: Path) -> None:
        import rasterio
        from affine import Affine
        from rasterio.crs import CRS

        lines: dict[str, list[str]] = {s: [] for s in MULTIMODAL_SPLITS}
        crs = CRS.from_epsg(32632)
        for ci, cls in enumerate(MULTIMODAL_CLASSES):
            for modality in ("s1", "s2"):
                (tmp / modality / cls).mkdir(parents=True)
            for split, members in split_members(seed, ci, counts, first=1).items():
                lines[split].extend(f"{cls}/{cls}_{k}" for k in members)
            for start in range(0, spc, _CHUNK):
                n = min(_CHUNK, spc - start)
                rng = np.random.default_rng([seed, ci, 0, start // _CHUNK])
                s2, s1 = _optical_and_radar(cls, rng, n, size)
                _clouds(rng, s2, cloud_fraction)
                s2_dn, s1_db = _noisy(s2, s1, rng)
                east = rng.uniform(300_000, 700_000, size=n)
                north = rng.uniform(4_500_000, 5_900_000, size=n)
                for j in range(n):
                    k = start + j + 1
                    grid = {
                        "driver": "GTiff",
                        "height": size,
                        "width": size,
                        "crs": crs,
                        "transform": Affine(10.0, 0, float(east[j]), 0, -10.0, float(north[j])),
                    }
                    with rasterio.open(
                        tmp / "s1" / cls / f"{cls}_{k}.tif", "w", count=2, dtype="float32", **grid
                    ) as dst:
                        dst.write(s1_db[j])
                        dst.descriptions = S1_BANDS
                    with rasterio.open(
                        tmp / "s2" / cls / f"{cls}_{k}.tif",
                        "w",
                        count=len(S2_BANDS),
                        dtype="uint16",
                        **grid,
                    ) as dst:
                        dst.write(s2_dn[j])
                        dst.descriptions = S2_BANDS
        (tmp / "classes.txt").write_text("\n".join(MULTIMODAL_CLASSES) + "\n")
        for split, ids in lines.items():
            (tmp / _SPLIT_FILE.format(split=split)).write_text("\n".join(ids) + "\n")

    return generate_tree(root, params, write, what="generate_multimodal")
