"""Synthetic EuroSAT in torchgeo's real on-disk layout (13-band GeoTIFFs, split files).

Every class is a spatial pattern (stripes, blobs, a road, a river, a grid of houses, ...)
mixing class-typical Sentinel-2 material spectra, with per-image spectral and brightness
jitter and pixel noise, so accuracy numbers mean something. The layout is
:mod:`~raytrain_hetero.workloads.formats`'; the loader stays torchgeo's own
(:func:`~raytrain_hetero.workloads.eurosat.eurosat_datasets`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raytrain_hetero.workloads.formats import (
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    EUROSAT_IMAGE_DIR,
    EUROSAT_SPLIT_FILE,
    eurosat_file_name,
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

# Bump whenever the generated pixels or layout change, so stale caches are regenerated.
_GENERATOR_VERSION = 2
_CHUNK = 256  # images generated per vectorised batch (fixed: part of the deterministic recipe)
_PALETTE = d.material_palette(EUROSAT_BANDS)
# Additive sensor noise, ~1% of the band's typical level (B10, cirrus, is ~12 DN).
_NOISE_FLOOR = 0.01 * np.mean(list(_PALETTE.values()), axis=0)[None, :, None, None]


def _class_images(cls: str, rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    """Clean (noise-free) images of one class, (n, 13, S, S) float32."""
    texture = d.smooth_noise
    layers: list[tuple[str, np.ndarray | float]]
    if cls == "AnnualCrop":  # parallel furrows: crop rows over bare soil
        layers = [("soil", 1.0), ("crop", d.stripes(rng, n, s, 5.0, 10.0))]
    elif cls == "Forest":  # fine-grained canopy with shadows
        layers = [("shadow", 1.0), ("forest", d.soft(texture(rng, n, s, 1.5), 1.5))]
    elif cls == "HerbaceousVegetation":  # mid-scale patchwork of shrubs, grass, soil
        a = d.soft(texture(rng, n, s, 4.0), 2.0)
        b = d.soft(texture(rng, n, s, 6.0) - 0.8, 2.0)
        layers = [("grass", 1.0), ("herb", a), ("soil", b)]
    elif cls == "Highway":  # one straight road across fields
        fields = d.soft(texture(rng, n, s, 8.0), 1.0)
        road = d.line(rng, n, s, (2.0, 4.0), meander=0.0)
        layers = [("grass", 1.0), ("crop", fields), ("asphalt", road)]
    elif cls == "Industrial":  # large bright halls on concrete
        layers = [("concrete", 1.0), ("roof", d.rectangles(rng, n, s, 6))]
    elif cls == "Pasture":  # nearly uniform meadow, very smooth variation
        layers = [("grass", 1.0), ("crop", 0.35 * d.soft(texture(rng, n, s, 12.0), 0.8))]
    elif cls == "PermanentCrop":  # orchard: a regular lattice of tree crowns over soil
        layers = [("soil", 1.0), ("herb", 0.5), ("forest", d.dots(rng, n, s, 5.0, 8.0))]
    elif cls == "Residential":  # a grid of houses with streets, gardens between
        houses, streets = d.grid(rng, n, s, 6.0, 9.0, 0.55)
        layers = [("grass", 1.0), ("roof", houses), ("asphalt", streets)]
    elif cls == "River":  # a meandering water band through vegetation
        land = d.soft(texture(rng, n, s, 6.0), 1.0)
        river = d.line(rng, n, s, (5.0, 10.0), meander=s / 8)
        layers = [("grass", 1.0), ("forest", land), ("water", river)]
    elif cls == "SeaLake":  # open water; a third of the images show a shoreline
        u, _ = d.coords(rng, n, s)
        shore_at = rng.uniform(0.6, 0.9, size=(n, 1, 1)) * u.max(axis=(1, 2), keepdims=True)
        has_shore = (rng.random((n, 1, 1)) < 0.33).astype(np.float32)
        land = np.clip(u - shore_at + 0.5, 0.0, 1.0).astype(np.float32) * has_shore
        ripples = 0.15 * d.soft(texture(rng, n, s, 10.0), 1.0)
        layers = [("water", 1.0), ("grass", ripples + land)]
    else:  # pragma: no cover
        raise AssertionError(cls)
    return d.paint(rng, n, _PALETTE, layers)


def _write_tree(tmp: Path, samples_per_class: int, seed: int, size: int, counts: dict) -> None:
    import rasterio

    write_split_lists(
        tmp, EUROSAT_SPLIT_FILE, seed, EUROSAT_CLASSES, counts, eurosat_file_name, first=1
    )
    with rasterio.Env():
        for _, cls, start, n, rng in class_chunks(seed, EUROSAT_CLASSES, samples_per_class, _CHUNK):
            cdir = tmp / EUROSAT_IMAGE_DIR / cls
            cdir.mkdir(parents=True, exist_ok=True)
            clean = _class_images(cls, rng, n, size)
            images = d.quantise(
                clean, rng, gain=(0.85, 1.15), relative=0.04, additive=_NOISE_FLOOR, dtype=np.uint16
            )
            # Georeference like the real tiles: a UTM zone over Europe, 10 m pixels.
            zones = rng.integers(29, 36, size=n)
            east = rng.uniform(300_000, 700_000, size=n)
            north = rng.uniform(4_300_000, 6_500_000, size=n)
            for j in range(n):
                write_geotiff(
                    cdir / eurosat_file_name(cls, start + j + 1),
                    images[j],
                    epsg=32600 + int(zones[j]),
                    origin=(east[j], north[j]),
                    pixel=10.0,
                )


def generate_eurosat(
    root: str | os.PathLike[str],
    *,
    samples_per_class: int = 100,
    seed: int = 0,
    size: int = 64,
    split_fractions: Sequence[float] = (0.7, 0.15, 0.15),
) -> Path:
    """Write a synthetic EuroSAT in torchgeo's real on-disk layout under ``root``; return it.

    ``samples_per_class`` images of ``size`` x ``size`` px per class (10 classes), split per
    class into train/val/test by ``split_fractions`` (every class gets >= 1 image in every
    split, as torchgeo requires). Deterministic given the arguments. Cached and atomic, and a
    real dataset at ``root`` is never touched (see
    :func:`~raytrain_hetero.workloads.generated_tree.generate_tree`).

    Raises:
        ConfigError: invalid parameters.
        DataError: ``root`` is a file, or a non-empty directory this function did not create.
    """
    what = "generate_eurosat"
    check_integers(what, ("samples_per_class", samples_per_class, 3), ("seed", seed, 0))
    check_integers(what, ("size", size, 16))
    fractions = check_split_fractions(what, split_fractions)
    counts = split_counts(what, samples_per_class, fractions)
    params = {
        "generator": "raytrain_hetero.workloads.eurosat",
        "version": _GENERATOR_VERSION,
        "samples_per_class": int(samples_per_class),
        "seed": int(seed),
        "size": int(size),
        "split_fractions": list(fractions),
    }
    return generate_tree(
        root,
        params,
        lambda tmp: _write_tree(tmp, int(samples_per_class), int(seed), int(size), counts),
        what=what,
    )
