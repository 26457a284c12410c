"""Synthetic EuroSAT in torchgeo's real on-disk layout (13-band GeoTIFFs, split files).

Every class is a spatial pattern mixing class-typical Sentinel-2 material spectra, with
per-image spectral and brightness jitter and pixel noise, so accuracy numbers mean something.
The loader stays torchgeo's own (:func:`~raytrain_hetero.workloads.eurosat.eurosat_datasets`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.workloads.eurosat import (
    _BASE_DIR,
    _SPLIT_FILE,
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    EUROSAT_MEAN,
    EUROSAT_SPLITS,
)
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    split_counts,
    split_members,
)

__all__ = ["generate_eurosat"]

logger = logging.getLogger(__name__)

# Bump whenever the generated pixels or layout change, so stale caches are regenerated.
_GENERATOR_VERSION = 1
_CHUNK = 256  # images generated per vectorised batch (fixed: part of the deterministic recipe)

# --------------------------------------------------------------------------------------
# Synthetic spectra: plausible Sentinel-2 L1C top-of-atmosphere reflectance * 10000, in
# EUROSAT_BANDS order (B01 ... B12, B8A). Vegetation: low red (B04), steep red edge
# (B05-B07), high NIR (B08/B8A); water: NIR/SWIR near zero; urban: flat and bright; B10
# (cirrus) is ~10 everywhere, B09 (water vapour) tracks NIR weakly.
# --------------------------------------------------------------------------------------
_MATERIALS: dict[str, list[float]] = {
    #           B01   B02   B03   B04   B05   B06   B07   B08   B09 B10   B11   B12   B8A
    "forest":  [1250,  950,  800,  550,  900, 2100, 2600, 2550, 850, 10, 1400,  650, 2850],
    "shadow":  [1150,  820,  650,  420,  650, 1400, 1700, 1650, 600,  9,  950,  450, 1850],
    "crop":    [1300, 1050, 1000,  700, 1150, 2500, 3000, 2950, 950, 12, 1900, 1000, 3300],
    "grass":   [1300, 1050, 1050,  900, 1250, 2200, 2600, 2550, 850, 11, 2100, 1250, 2850],
    "herb":    [1350, 1100, 1100, 1050, 1350, 2000, 2300, 2250, 800, 12, 2300, 1550, 2500],
    "soil":    [1450, 1300, 1350, 1500, 1700, 1950, 2100, 2100, 700, 14, 2800, 2250, 2250],
    "water":   [1350, 1100,  900,  650,  550,  450,  420,  380, 150,  8,  200,  130,  360],
    "concrete": [1550, 1450, 1450, 1500, 1600, 1700, 1800, 1800, 600, 16, 2300, 2000, 1900],
    "roof":    [1750, 1700, 1750, 1850, 1950, 2050, 2100, 2100, 650, 18, 2650, 2350, 2200],
    "asphalt": [1400, 1200, 1150, 1150, 1250, 1350, 1400, 1400, 480, 13, 1600, 1400, 1450],
}  # fmt: skip
_MAT = {k: np.asarray(v, dtype=np.float32) for k, v in _MATERIALS.items()}


# ----------------------------------------------------------------------------- patterns
# Every pattern function returns float32 masks in [0, 1] of shape (n, S, S).


def _coords(rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-image rotated coordinates (u along a random direction, v across it)."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    theta = rng.uniform(0.0, np.pi, size=(n, 1, 1)).astype(np.float32)
    c, sn = np.cos(theta), np.sin(theta)
    u = xx * c + yy * sn
    v = -xx * sn + yy * c
    return u, v


def _smooth_noise(rng: np.random.Generator, n: int, s: int, scale: float) -> np.ndarray:
    """Gaussian random field with correlation length ~``scale`` px, standardised per image."""
    white = rng.standard_normal((n, s, s)).astype(np.float32)
    fy = np.fft.fftfreq(s).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(s).astype(np.float32)[None, :]
    filt = np.exp(-2.0 * (np.pi * scale) ** 2 * (fx**2 + fy**2))
    field = np.fft.irfft2(np.fft.rfft2(white) * filt, s=(s, s)).astype(np.float32)
    field -= field.mean(axis=(1, 2), keepdims=True)
    field /= field.std(axis=(1, 2), keepdims=True) + 1e-6
    return field


def _soft(x: np.ndarray, sharpness: float = 4.0) -> np.ndarray:
    """Soft threshold at 0 (anti-aliased edges)."""
    return (1.0 / (1.0 + np.exp(-sharpness * x))).astype(np.float32)


def _stripes(rng: np.random.Generator, n: int, s: int, lo: float, hi: float) -> np.ndarray:
    u, _ = _coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1)).astype(np.float32)
    return _soft(np.sin(2 * np.pi * u / period + phase), 3.0)


def _dots(rng: np.random.Generator, n: int, s: int, lo: float, hi: float) -> np.ndarray:
    u, v = _coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    pu, pv = rng.uniform(0, 2 * np.pi, size=(2, n, 1, 1)).astype(np.float32)
    g = np.sin(2 * np.pi * u / period + pu) * np.sin(2 * np.pi * v / period + pv)
    return _soft(g - 0.25, 6.0)


def _line(
    rng: np.random.Generator, n: int, s: int, width: tuple[float, float], meander: float
) -> np.ndarray:
    """A band of random width crossing the image near its centre, optionally meandering."""
    u, v = _coords(rng, n, s)
    # v of the image centre for each image, plus a random offset.
    vc = v[:, s // 2, s // 2][:, None, None] + rng.uniform(-s / 6, s / 6, size=(n, 1, 1))
    w = rng.uniform(*width, size=(n, 1, 1)).astype(np.float32)
    if meander > 0:
        amp = rng.uniform(0.3, 1.0, size=(n, 1, 1)) * meander
        lam = rng.uniform(0.6, 1.2, size=(n, 1, 1)) * s
        ph = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
        vc = vc + amp * np.sin(2 * np.pi * u / lam + ph)
    dist = np.abs(v - vc)
    return np.clip(w / 2.0 - dist + 0.5, 0.0, 1.0).astype(np.float32)


def _grid(
    rng: np.random.Generator, n: int, s: int, lo: float, hi: float, fill: float
) -> tuple[np.ndarray, np.ndarray]:
    """Regular blocks (houses) and the streets between them (every few rows)."""
    u, v = _coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    off = rng.uniform(0, 1, size=(2, n, 1, 1)).astype(np.float32)
    fu = np.mod(u / period + off[0], 1.0)
    fv = np.mod(v / period + off[1], 1.0)
    houses = ((fu < fill) & (fv < fill)).astype(np.float32)
    street_every = rng.integers(3, 5, size=(n, 1, 1))
    row = np.floor(v / period + off[1]).astype(np.int64)
    streets = ((np.mod(row, street_every) == 0) & (fv > 0.55)).astype(np.float32)
    return houses * (1 - streets), streets


def _rectangles(rng: np.random.Generator, n: int, s: int, k: int) -> np.ndarray:
    """Union of ``k`` axis-aligned large rectangles (industrial halls) per image."""
    yy, xx = np.mgrid[0:s, 0:s]
    x0 = rng.integers(0, s, size=(n, k, 1, 1))
    y0 = rng.integers(0, s, size=(n, k, 1, 1))
    w = rng.integers(s // 6, s // 2, size=(n, k, 1, 1))
    h = rng.integers(s // 6, s // 2, size=(n, k, 1, 1))
    present = rng.random((n, k, 1, 1)) < 0.7
    inside = present & (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
    return inside.any(axis=1).astype(np.float32)


# ------------------------------------------------------------------------------ classes


def _compose(
    rng: np.random.Generator, n: int, layers: list[tuple[str, np.ndarray | float]]
) -> np.ndarray:
    """Paint materials onto each other: ``layers[0]`` is the background (mask 1.0), every
    further ``(material, mask)`` is alpha-blended on top. Every material spectrum gets a
    per-image, per-band multiplicative jitter. Returns (n, 13, S, S) float32."""
    out: np.ndarray | None = None
    for name, mask in layers:
        spec = _MAT[name][None, :] * (
            1.0 + 0.06 * rng.standard_normal((n, len(EUROSAT_BANDS))).astype(np.float32)
        )
        spec = spec[:, :, None, None]
        if out is None:
            out = np.broadcast_to(spec, spec.shape).copy()
            continue
        m = mask if isinstance(mask, float) else mask[:, None, :, :]
        out = out + m * (spec - out)
    assert out is not None
    return out


def _class_images(cls: str, rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    """Clean (noise-free) images of one class, (n, 13, S, S) float32."""
    if cls == "AnnualCrop":  # parallel furrows: crop rows over bare soil
        stripes = _stripes(rng, n, s, 5.0, 10.0)
        return _compose(rng, n, [("soil", 1.0), ("crop", stripes)])
    if cls == "Forest":  # fine-grained canopy with shadows
        blobs = _soft(_smooth_noise(rng, n, s, 1.5), 1.5)
        return _compose(rng, n, [("shadow", 1.0), ("forest", blobs)])
    if cls == "HerbaceousVegetation":  # mid-scale patchwork of shrubs, grass, soil
        a = _soft(_smooth_noise(rng, n, s, 4.0), 2.0)
        b = _soft(_smooth_noise(rng, n, s, 6.0) - 0.8, 2.0)
        return _compose(rng, n, [("grass", 1.0), ("herb", a), ("soil", b)])
    if cls == "Highway":  # one straight road across fields
        fields = _soft(_smooth_noise(rng, n, s, 8.0), 1.0)
        road = _line(rng, n, s, (2.0, 4.0), meander=0.0)
        return _compose(rng, n, [("grass", 1.0), ("crop", fields), ("asphalt", road)])
    if cls == "Industrial":  # large bright halls on concrete
        halls = _rectangles(rng, n, s, 6)
        return _compose(rng, n, [("concrete", 1.0), ("roof", halls)])
    if cls == "Pasture":  # nearly uniform meadow, very smooth variation
        meadow = _soft(_smooth_noise(rng, n, s, 12.0), 0.8)
        return _compose(rng, n, [("grass", 1.0), ("crop", 0.35 * meadow)])
    if cls == "PermanentCrop":  # orchard: a regular lattice of tree crowns over soil
        trees = _dots(rng, n, s, 5.0, 8.0)
        return _compose(rng, n, [("soil", 1.0), ("herb", 0.5), ("forest", trees)])
    if cls == "Residential":  # a grid of houses with streets, gardens between
        houses, streets = _grid(rng, n, s, 6.0, 9.0, 0.55)
        return _compose(rng, n, [("grass", 1.0), ("roof", houses), ("asphalt", streets)])
    if cls == "River":  # a meandering water band through vegetation
        land = _soft(_smooth_noise(rng, n, s, 6.0), 1.0)
        river = _line(rng, n, s, (5.0, 10.0), meander=s / 8)
        return _compose(rng, n, [("grass", 1.0), ("forest", land), ("water", river)])
    if cls == "SeaLake":  # open water; a third of the images show a shoreline
        u, _ = _coords(rng, n, s)
        shore_at = rng.uniform(0.6, 0.9, size=(n, 1, 1)) * u.max(axis=(1, 2), keepdims=True)
        has_shore = (rng.random((n, 1, 1)) < 0.33).astype(np.float32)
        land = np.clip(u - shore_at + 0.5, 0.0, 1.0).astype(np.float32) * has_shore
        ripples = 0.15 * _soft(_smooth_noise(rng, n, s, 10.0), 1.0)
        return _compose(rng, n, [("water", 1.0), ("grass", ripples + land)])
    raise AssertionError(cls)  # pragma: no cover


def _noisy_uint16(clean: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness jitter per image, multiplicative pixel noise, quantisation to uint16."""
    n = clean.shape[0]
    brightness = rng.uniform(0.85, 1.15, size=(n, 1, 1, 1)).astype(np.float32)
    noise = rng.standard_normal(clean.shape, dtype=np.float32)
    floor = (0.01 * np.asarray([EUROSAT_MEAN[b] for b in EUROSAT_BANDS], np.float32))[
        None, :, None, None
    ]  # additive sensor noise, ~1% of the band's typical level (B10 is ~12 DN)
    img = clean * brightness * (1.0 + 0.04 * noise) + floor * noise
    return np.clip(np.rint(img), 1, 65535).astype(np.uint16)


# ---------------------------------------------------------------------------- generator


def _check_generate_args(
    samples_per_class: Any, seed: Any, size: Any, split_fractions: Any
) -> dict[str, int]:
    what = "generate_eurosat"
    check_integers(what, ("samples_per_class", samples_per_class, 3), ("seed", seed, 0))
    check_integers(what, ("size", size, 16))
    fractions = check_split_fractions(what, split_fractions)
    return split_counts(what, samples_per_class, fractions)


def _marker_params(samples_per_class: int, seed: int, size: int, fr: Sequence[float]) -> dict:
    return {
        "generator": "raytrain_hetero.workloads.eurosat",
        "version": _GENERATOR_VERSION,
        "samples_per_class": int(samples_per_class),
        "seed": int(seed),
        "size": int(size),
        "split_fractions": [float(f) for f in fr],
    }


def _write_tree(tmp: Path, params: Mapping[str, Any], counts: Mapping[str, int]) -> None:
    import rasterio
    from affine import Affine
    from rasterio.crs import CRS

    spc, seed, size = params["samples_per_class"], params["seed"], params["size"]
    base = tmp / _BASE_DIR
    split_lines: dict[str, list[str]] = {s: [] for s in EUROSAT_SPLITS}
    crs_cache: dict[int, Any] = {}
    with rasterio.Env():
        for ci, cls in enumerate(EUROSAT_CLASSES):
            cdir = base / cls
            cdir.mkdir(parents=True)
            # Split membership: a seeded permutation of the image numbers 1..spc per class.
            for split, members in split_members(seed, ci, counts, first=1).items():
                split_lines[split].extend(f"{cls}_{k}.tif" for k in members)
            for start in range(0, spc, _CHUNK):
                n = min(_CHUNK, spc - start)
                rng = np.random.default_rng([seed, ci, 0, start // _CHUNK])
                images = _noisy_uint16(_class_images(cls, rng, n, size), rng)
                # Georeference like the real tiles: a UTM zone over Europe, 10 m pixels.
                zones = rng.integers(29, 36, size=n)
                east = rng.uniform(300_000, 700_000, size=n)
                north = rng.uniform(4_300_000, 6_500_000, size=n)
                for j in range(n):
                    epsg = 32600 + int(zones[j])
                    crs = crs_cache.get(epsg)
                    if crs is None:
                        crs = crs_cache[epsg] = CRS.from_epsg(epsg)
                    k = start + j + 1
                    with rasterio.open(
                        cdir / f"{cls}_{k}.tif",
                        "w",
                        driver="GTiff",
                        dtype="uint16",
                        count=len(EUROSAT_BANDS),
                        height=size,
                        width=size,
                        crs=crs,
                        transform=Affine(10.0, 0.0, float(east[j]), 0.0, -10.0, float(north[j])),
                    ) as dst:
                        dst.write(images[j])
    for split, lines in split_lines.items():
        (tmp / _SPLIT_FILE.format(split=split)).write_text("\n".join(lines) + "\n")


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
    split, as torchgeo requires). Deterministic given the arguments.

    Caching and safety:

    * ``root/.raytrain_hetero_generated.json`` records the parameters; if it matches, this
      returns at once without touching any file.
    * Generation writes into a hidden temporary sibling of ``root`` and renames it into
      place, so an interrupted run never leaves a half-written ``root`` (at worst a hidden
      ``.<name>.generating-*`` sibling). Concurrent callers with the same parameters are safe:
      the first rename wins and the others return its result.
    * A marker with *different* parameters means ``root`` is ours: it is replaced.
    * An existing non-empty ``root`` without a marker (e.g. a real downloaded EuroSAT) is
      never modified: :class:`~raytrain_hetero.errors.DataError` is raised instead.

    Raises:
        ConfigError: invalid parameters.
        DataError: ``root`` is a file, or a non-empty directory this function did not create.
    """
    counts = _check_generate_args(samples_per_class, seed, size, split_fractions)
    root = Path(root).expanduser().absolute()
    params = _marker_params(samples_per_class, seed, size, split_fractions)
    return generate_tree(
        root, params, lambda tmp: _write_tree(tmp, params, counts), what="generate_eurosat"
    )
