"""Drawing helpers shared by the image generators: textures, shapes, materials, noise.

Every scene generator here paints the same way: masks in [0, 1] of shape ``(n, H, W)``
(textures, stripes, lattices, roads, houses), alpha-blended layer on layer with a material's
spectrum jittered per image (:func:`paint`), then brightness jitter, pixel noise and
quantisation to the file's integer type (:func:`quantise`). The class structure a model learns
lives in which materials a class uses and in the spatial pattern of its masks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raytrain_hetero.workloads.formats import EUROSAT_BANDS

# Plausible Sentinel-2 L1C top-of-atmosphere reflectance * 10000, in EUROSAT_BANDS order
# (B01 ... B12, B8A). Vegetation: low red (B04), steep red edge (B05-B07), high NIR (B08/B8A);
# water: NIR/SWIR near zero; urban: flat and bright; B10 (cirrus) is ~10 everywhere, B09
# (water vapour) tracks NIR weakly.
_S2_SPECTRA: dict[str, list[float]] = {
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
#: Material name -> float32 spectrum over all 13 Sentinel-2 bands (EUROSAT_BANDS order).
SENTINEL2_MATERIALS: dict[str, np.ndarray] = {
    k: np.asarray(v, dtype=np.float32) for k, v in _S2_SPECTRA.items()
}


def material_palette(bands: Sequence[str]) -> dict[str, np.ndarray]:
    """The Sentinel-2 materials restricted to ``bands`` (names from EUROSAT_BANDS), in order."""
    index = [EUROSAT_BANDS.index(b) for b in bands]
    return {name: spectrum[index] for name, spectrum in SENTINEL2_MATERIALS.items()}


# ---------------------------------------------------------------------------------- textures


def smooth_noise(
    rng: np.random.Generator, n: int, s: int, scale: float, width: int | None = None
) -> np.ndarray:
    """Gaussian random fields ``(n, s, width or s)`` with correlation length ~``scale`` px
    (periodic), standardised per image."""
    w = s if width is None else width
    white = rng.standard_normal((n, s, w)).astype(np.float32)
    fy = np.fft.fftfreq(s).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    filt = np.exp(-2.0 * (np.pi * scale) ** 2 * (fx**2 + fy**2))
    field = np.fft.irfft2(np.fft.rfft2(white) * filt, s=(s, w)).astype(np.float32)
    field -= field.mean(axis=(1, 2), keepdims=True)
    field /= field.std(axis=(1, 2), keepdims=True) + 1e-6
    return field


def soft(x: np.ndarray, sharpness: float = 4.0) -> np.ndarray:
    """Soft threshold at 0 (anti-aliased edges)."""
    return (1.0 / (1.0 + np.exp(-sharpness * x))).astype(np.float32)


# ------------------------------------------------------------------------------------ shapes


def coords(
    rng: np.random.Generator, n: int, s: int, *, centred: bool = False, jitter: float = 0.15
) -> tuple[np.ndarray, np.ndarray]:
    """Per-image rotated coordinates (u along a random direction, v across it); ``centred``:
    about a point near the image centre (``jitter``: its spread, fractions of ``s``)."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    if centred:
        xx = xx - (s / 2 + rng.uniform(-jitter, jitter, size=(n, 1, 1)) * s).astype(np.float32)
        yy = yy - (s / 2 + rng.uniform(-jitter, jitter, size=(n, 1, 1)) * s).astype(np.float32)
    theta = rng.uniform(0.0, 2 * np.pi if centred else np.pi, size=(n, 1, 1)).astype(np.float32)
    c, sn = np.cos(theta), np.sin(theta)
    return xx * c + yy * sn, -xx * sn + yy * c


def stripes(rng: np.random.Generator, n: int, s: int, lo: float, hi: float) -> np.ndarray:
    """Parallel soft stripes of a random period in [lo, hi] px and direction."""
    u, _ = coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1)).astype(np.float32)
    return soft(np.sin(2 * np.pi * u / period + phase), 3.0)


def dots(rng: np.random.Generator, n: int, s: int, lo: float, hi: float) -> np.ndarray:
    """A rotated lattice of soft dots (tree crowns, houses) of period in [lo, hi] px."""
    u, v = coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    pu, pv = rng.uniform(0, 2 * np.pi, size=(2, n, 1, 1)).astype(np.float32)
    g = np.sin(2 * np.pi * u / period + pu) * np.sin(2 * np.pi * v / period + pv)
    return soft(g - 0.25, 6.0)


def line(
    rng: np.random.Generator, n: int, s: int, width: tuple[float, float], meander: float
) -> np.ndarray:
    """A band of random width crossing the image near its centre, optionally meandering."""
    u, v = coords(rng, n, s)
    # v of the image centre for each image, plus a random offset.
    vc = v[:, s // 2, s // 2][:, None, None] + rng.uniform(-s / 6, s / 6, size=(n, 1, 1))
    w = rng.uniform(*width, size=(n, 1, 1)).astype(np.float32)
    if meander > 0:
        amp = rng.uniform(0.3, 1.0, size=(n, 1, 1)) * meander
        lam = rng.uniform(0.6, 1.2, size=(n, 1, 1)) * s
        ph = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
        vc = vc + amp * np.sin(2 * np.pi * u / lam + ph)
    return np.clip(w / 2.0 - np.abs(v - vc) + 0.5, 0.0, 1.0).astype(np.float32)


def grid(
    rng: np.random.Generator, n: int, s: int, lo: float, hi: float, fill: float
) -> tuple[np.ndarray, np.ndarray]:
    """Regular blocks (houses) and the streets between them (every few rows)."""
    u, v = coords(rng, n, s)
    period = rng.uniform(lo, hi, size=(n, 1, 1)).astype(np.float32)
    off = rng.uniform(0, 1, size=(2, n, 1, 1)).astype(np.float32)
    fu = np.mod(u / period + off[0], 1.0)
    fv = np.mod(v / period + off[1], 1.0)
    houses = ((fu < fill) & (fv < fill)).astype(np.float32)
    street_every = rng.integers(3, 5, size=(n, 1, 1))
    row = np.floor(v / period + off[1]).astype(np.int64)
    streets = ((np.mod(row, street_every) == 0) & (fv > 0.55)).astype(np.float32)
    return houses * (1 - streets), streets


def rectangles(rng: np.random.Generator, n: int, s: int, k: int) -> np.ndarray:
    """Union of up to ``k`` axis-aligned large rectangles (halls, lots) per image."""
    yy, xx = np.mgrid[0:s, 0:s]
    x0 = rng.integers(0, s, size=(n, k, 1, 1))
    y0 = rng.integers(0, s, size=(n, k, 1, 1))
    w = rng.integers(s // 6, s // 2, size=(n, k, 1, 1))
    h = rng.integers(s // 6, s // 2, size=(n, k, 1, 1))
    present = rng.random((n, k, 1, 1)) < 0.7
    inside = present & (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
    return inside.any(axis=1).astype(np.float32)


def disks(rng: np.random.Generator, n: int, s: int, k: int, r: tuple[float, float]) -> np.ndarray:
    """Union of up to ``k`` discs of radius in ``r`` (fractions of ``s``) per image."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    cx = rng.uniform(0.1 * s, 0.9 * s, size=(n, k, 1, 1)).astype(np.float32)
    cy = rng.uniform(0.1 * s, 0.9 * s, size=(n, k, 1, 1)).astype(np.float32)
    rad = (rng.uniform(*r, size=(n, k, 1, 1)) * s).astype(np.float32)
    present = rng.random((n, k, 1, 1)) < 0.8
    present[:, 0] = True
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    return (np.clip(rad - d + 0.5, 0, 1) * present).max(axis=1).astype(np.float32)


def boxes(u: np.ndarray, v: np.ndarray, half_u: Any, half_v: Any) -> np.ndarray:
    """Anti-aliased rectangle ``|u| < half_u, |v| < half_v`` in rotated coordinates."""
    a = np.clip(half_u - np.abs(u) + 0.5, 0, 1)
    b = np.clip(half_v - np.abs(v) + 0.5, 0, 1)
    return (a * b).astype(np.float32)


# ------------------------------------------------------------------------ painting and noise


def paint(
    rng: np.random.Generator,
    n: int,
    palette: Mapping[str, np.ndarray],
    layers: Sequence[tuple[str | np.ndarray, np.ndarray | float]],
    jitter: float = 0.06,
) -> np.ndarray:
    """Alpha-blend material layers into ``(n, C, H, W)`` float32 images.

    ``layers[0]`` is the background; every further ``(material, mask)`` is blended on top
    with ``mask`` (an ``(n, H, W)`` array or a constant). A material is a palette name (its
    ``C`` values get a per-image, per-channel multiplicative jitter of relative size
    ``jitter``) or an explicit ``(n, C)`` array. At least one mask must be an array.
    """
    h, w = next(m.shape[-2:] for _, m in layers if isinstance(m, np.ndarray))
    out: np.ndarray | None = None
    for material, mask in layers:
        if isinstance(material, str):
            values = palette[material]
            colour = values[None, :] * (
                1.0 + jitter * rng.standard_normal((n, values.size)).astype(np.float32)
            )
        else:
            colour = material.astype(np.float32)
        colour = colour[:, :, None, None]
        if out is None:
            out = np.broadcast_to(colour, (n, colour.shape[1], h, w)).copy()
            continue
        m = mask if isinstance(mask, float) else mask[:, None, :, :]
        out = out + m * (colour - out)
    assert out is not None
    return out.astype(np.float32, copy=False)


def quantise(
    clean: np.ndarray,
    rng: np.random.Generator,
    *,
    gain: tuple[float, float],
    relative: float,
    additive: Any,
    dtype: type[np.integer],
    lowest: int = 1,
) -> np.ndarray:
    """Per-image brightness gain, multiplicative and additive pixel noise, rounding to ``dtype``.

    ``image = clean * gain * (1 + relative * e) + additive * e`` with one standard normal
    ``e`` per pixel (``additive`` may be per band, broadcast over ``(n, C, H, W)``); values
    are clipped to ``[lowest, dtype max]`` (Sentinel-2 keeps 0 for no data, hence 1).
    """
    n = clean.shape[0]
    brightness = rng.uniform(*gain, size=(n, 1, 1, 1)).astype(np.float32)
    noise = rng.standard_normal(clean.shape, dtype=np.float32)
    image = clean * brightness * (1.0 + relative * noise) + additive * noise
    return np.clip(np.rint(image), lowest, np.iinfo(dtype).max).astype(dtype)
