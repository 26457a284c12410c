"""Synthetic co-registered Sentinel-1 / Sentinel-2 patch pairs (So2Sat-style classes).

SAR backscatter per class with speckle, optical spectra shared with the EuroSAT generator
(:mod:`~raytrain_hetero.workloads.synthetic.drawing`), and clouds over a share of the optical
patches, in the layout of :mod:`~raytrain_hetero.workloads.formats`; read back by
:func:`~raytrain_hetero.workloads.multimodal.multimodal_datasets`.

The classes are Local-Climate-Zone-like land covers whose evidence is split between the
sensors: optical spectra separate vegetation, soil, water and built-up materials, but a
``cloud_fraction`` of the Sentinel-2 patches are under thick cloud (and its shadow); SAR sees
through clouds and separates built-up types by double-bounce brightness and texture, but not
low plants from bare soil (similar roughness) under multiplicative speckle. So each single
modality is ambiguous on a known subset of samples and fusion is not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.formats import (
    MULTIMODAL_CLASSES,
    MULTIMODAL_CLASSES_FILE,
    MULTIMODAL_MODALITIES,
    MULTIMODAL_SPLIT_FILE,
    S1_BANDS,
    S2_BANDS,
    multimodal_sample_id,
)
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.synthetic import drawing as d
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    class_chunks,
    split_counts,
    write_geotiff,
    write_split_lists,
)

_GENERATOR_VERSION = 2
_CHUNK = 128
_PALETTE = d.material_palette(S2_BANDS)

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


def class_scenes(
    cls: str, rng: np.random.Generator, n: int, s: int
) -> tuple[np.ndarray, np.ndarray]:
    """Clean S2 (n, 10, s, s) reflectance*1e4 and S1 (n, 2, s, s) linear sigma0 of a class."""
    layers: list[tuple[str, Any]]
    bright = np.zeros((n, s, s), np.float32)  # extra SAR double-bounce (linear multiplier)
    if cls == "BareSoil":
        layers = [("soil", 1.0), ("herb", 0.4 * d.soft(d.smooth_noise(rng, n, s, 6.0), 1.0))]
    elif cls == "CompactUrban":
        houses, streets = d.grid(rng, n, s, 4.0, 6.0, 0.7)
        layers = [("concrete", 1.0), ("roof", houses), ("asphalt", streets)]
        bright = 6.0 * houses
    elif cls == "DenseTrees":
        layers = [("shadow", 1.0), ("forest", d.soft(d.smooth_noise(rng, n, s, 1.5), 1.5))]
    elif cls == "HeavyIndustry":
        halls = d.rectangles(rng, n, s, 4)
        layers = [("concrete", 1.0), ("roof", halls)]
        bright = 8.0 * (halls - np.roll(halls, 1, axis=2)).clip(0, 1) + 1.5 * halls
    elif cls == "LowPlants":
        layers = [("soil", 1.0), ("crop", d.stripes(rng, n, s, 4.0, 8.0))]
    elif cls == "SparselyBuilt":
        houses = d.dots(rng, n, s, 7.0, 10.0)
        trees = 0.4 * d.soft(d.smooth_noise(rng, n, s, 3.0), 1.0)
        layers = [("grass", 1.0), ("forest", trees), ("roof", houses)]
        bright = 10.0 * houses
    elif cls == "Water":
        u, _ = d.coords(rng, n, s)
        top = rng.uniform(0.7, 1.0, (n, 1, 1)) * u.max(axis=(1, 2), keepdims=True)
        layers = [("water", 1.0), ("grass", np.clip(u - top, 0, 1).astype(np.float32))]
    else:  # pragma: no cover
        raise AssertionError(cls)
    optical = d.paint(rng, n, _PALETTE, layers)
    vv, vh = _SIGMA0_DB[cls]
    base_db = np.array([vv, vh], np.float32)[None, :, None, None] + rng.normal(0, 1.0, (n, 1, 1, 1))
    texture = 1.5 * d.smooth_noise(rng, n, s, 2.0)[:, None]  # dB-scale field-level texture
    sigma0 = 10 ** ((base_db + texture) / 10) * (1 + bright[:, None])
    return optical, sigma0.astype(np.float32)


def add_clouds(rng: np.random.Generator, s2: np.ndarray, fraction: float) -> np.ndarray:
    """Cover ``fraction`` of the patches with thick cloud (bright, spectrally flat), in place;
    returns the cloudy-sample flags."""
    n, _, s, _ = s2.shape
    cloudy = rng.random(n) < fraction
    if not cloudy.any():
        return cloudy
    k = int(cloudy.sum())
    density = np.clip(0.85 + 0.6 * d.smooth_noise(rng, k, s, 8.0), 0, 1)[:, None]
    cloud = rng.uniform(5000, 8000, size=(k, 1, 1, 1)).astype(np.float32)
    flat = cloud * np.linspace(1.0, 0.8, len(S2_BANDS), dtype=np.float32)[None, :, None, None]
    s2[cloudy] = s2[cloudy] * (1 - density) + flat * density
    return cloudy


def optical_dn(s2: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sentinel-2 reflectance*1e4 -> uint16 DN with brightness jitter and pixel noise."""
    return d.quantise(s2, rng, gain=(0.9, 1.1), relative=0.03, additive=15.0, dtype=np.uint16)


def _speckle_db(s1: np.ndarray, rng: np.random.Generator, looks: float = 4.0) -> np.ndarray:
    """Multi-look gamma speckle on linear sigma0, then dB (float32)."""
    speckle = rng.gamma(looks, 1.0 / looks, size=s1.shape)
    return (10 * np.log10(np.maximum(s1 * speckle, 1e-5))).astype(np.float32)


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
        raise ConfigError(f"{what}: cloud_fraction must be in [0, 1), got {cloud_fraction}")
    fr = check_split_fractions(what, split_fractions)
    spc, seed, size = int(samples_per_class), int(seed), int(size)
    counts = split_counts(what, spc, fr)
    params = {
        "generator": "raytrain_hetero.workloads.multimodal",
        "version": _GENERATOR_VERSION,
        "samples_per_class": spc,
        "seed": seed,
        "size": size,
        "cloud_fraction": float(cloud_fraction),
        "split_fractions": list(fr),
    }

    def write(tmp: Path) -> None:
        import rasterio

        ids = multimodal_sample_id
        write_split_lists(
            tmp, MULTIMODAL_SPLIT_FILE, seed, MULTIMODAL_CLASSES, counts, ids, first=1
        )
        (tmp / MULTIMODAL_CLASSES_FILE).write_text("\n".join(MULTIMODAL_CLASSES) + "\n")
        with rasterio.Env():
            for _, cls, start, n, rng in class_chunks(seed, MULTIMODAL_CLASSES, spc, _CHUNK):
                for modality in MULTIMODAL_MODALITIES:
                    (tmp / modality / cls).mkdir(parents=True, exist_ok=True)
                s2, s1 = class_scenes(cls, rng, n, size)
                add_clouds(rng, s2, cloud_fraction)
                pair = (_speckle_db(s1, rng), optical_dn(s2, rng))
                east = rng.uniform(300_000, 700_000, size=n)
                north = rng.uniform(4_500_000, 5_900_000, size=n)
                for j in range(n):
                    for modality, arrays, bands in zip(
                        MULTIMODAL_MODALITIES, pair, (S1_BANDS, S2_BANDS), strict=True
                    ):
                        write_geotiff(
                            tmp / modality / f"{ids(cls, start + j + 1)}.tif",
                            arrays[j],
                            epsg=32632,
                            origin=(east[j], north[j]),
                            pixel=10.0,
                            descriptions=bands,
                        )

    return generate_tree(root, params, write, what=what)
