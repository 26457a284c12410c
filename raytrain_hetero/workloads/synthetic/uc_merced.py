"""Synthetic UC Merced in torchgeo's real on-disk layout (RGB TIFFs of 21 classes, split files).

Each class is drawn from shapes (roads, roofs, courts, water, trees ...) painted in 1-ft
aerial colours; some images are cut slightly shorter, as some real ones are. The loader stays
torchgeo's own (:func:`~raytrain_hetero.workloads.uc_merced.uc_merced_datasets`).
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
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    split_counts,
    split_members,
)
from raytrain_hetero.workloads.synthetic.eurosat import (
    _coords,
    _dots,
    _grid,
    _line,
    _rectangles,
    _smooth_noise,
    _soft,
    _stripes,
)
from raytrain_hetero.workloads.uc_merced import (
    _BASE_DIR,
    _SPLIT_FILE,
    UCMERCED_CLASSES,
    UCMERCED_SPLITS,
)

__all__ = ["generate_uc_merced"]

logger = logging.getLogger(__name__)

_GENERATOR_VERSION = 1
_CHUNK = 16  # images per vectorised batch (part of the deterministic recipe)

# Colours of 1-ft aerial RGB materials (linear 0..1).
_RGB: dict[str, tuple[float, float, float]] = {
    "grass": (0.40, 0.50, 0.28),
    "lawn": (0.45, 0.60, 0.30),
    "tree": (0.16, 0.26, 0.14),
    "shadow": (0.08, 0.10, 0.09),
    "shrub": (0.46, 0.43, 0.31),
    "soil": (0.56, 0.46, 0.36),
    "dry": (0.66, 0.58, 0.44),
    "sand": (0.86, 0.80, 0.64),
    "water": (0.14, 0.24, 0.30),
    "asphalt": (0.33, 0.33, 0.35),
    "concrete": (0.66, 0.66, 0.63),
    "roof_red": (0.58, 0.32, 0.26),
    "roof_grey": (0.50, 0.50, 0.53),
    "white": (0.93, 0.93, 0.92),
    "court_green": (0.24, 0.50, 0.36),
    "court_blue": (0.22, 0.36, 0.58),
}


# ----------------------------------------------------------------------------- shapes
# Every shape function returns float32 masks in [0, 1] of shape (n, S, S).


def _disks(rng: np.random.Generator, n: int, s: int, k: int, r: tuple[float, float]) -> np.ndarray:
    """Union of up to ``k`` discs of radius in ``r`` (fractions of S) per image."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    cx = rng.uniform(0.1 * s, 0.9 * s, size=(n, k, 1, 1)).astype(np.float32)
    cy = rng.uniform(0.1 * s, 0.9 * s, size=(n, k, 1, 1)).astype(np.float32)
    rad = (rng.uniform(*r, size=(n, k, 1, 1)) * s).astype(np.float32)
    present = rng.random((n, k, 1, 1)) < 0.8
    present[:, 0] = True
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    return (np.clip(rad - d + 0.5, 0, 1) * present).max(axis=1).astype(np.float32)


def _centred_uv(rng: np.random.Generator, n: int, s: int, jitter: float = 0.15):
    """Rotated coordinates centred near the image centre (u along, v across)."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
    cx = (s / 2 + rng.uniform(-jitter, jitter, size=(n, 1, 1)) * s).astype(np.float32)
    cy = (s / 2 + rng.uniform(-jitter, jitter, size=(n, 1, 1)) * s).astype(np.float32)
    theta = rng.uniform(0, 2 * np.pi, size=(n, 1, 1)).astype(np.float32)
    c, sn = np.cos(theta), np.sin(theta)
    u = (xx - cx) * c + (yy - cy) * sn
    v = -(xx - cx) * sn + (yy - cy) * c
    return u, v


def _box(u: np.ndarray, v: np.ndarray, half_u: Any, half_v: Any) -> np.ndarray:
    """Anti-aliased rectangle |u| < half_u, |v| < half_v."""
    a = np.clip(half_u - np.abs(u) + 0.5, 0, 1)
    b = np.clip(half_v - np.abs(v) + 0.5, 0, 1)
    return (a * b).astype(np.float32)


def _airplane(rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    u, v = _centred_uv(rng, n, s)
    length = rng.uniform(0.25, 0.4, size=(n, 1, 1)) * s
    span = length * rng.uniform(0.8, 1.0, size=(n, 1, 1))
    fuselage = _box(u, v, length / 2, length * 0.06)
    wings = _box(u + length * 0.05, v, length * 0.07, span / 2)
    tail = _box(u + length * 0.42, v, length * 0.04, span * 0.18)
    return np.maximum(np.maximum(fuselage, wings), tail)


def _diamond(rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Infield dirt (a quarter disc around the diamond) and the grass inside the diamond."""
    u, v = _centred_uv(rng, n, s, jitter=0.1)
    side = rng.uniform(0.22, 0.32, size=(n, 1, 1)) * s
    d = np.sqrt(u**2 + v**2)
    sector = ((u > -0.05 * s) & (np.abs(v) < u + 0.05 * s) & (d < side * 1.35)).astype(np.float32)
    inner = ((np.abs(u - side / 2) + np.abs(v)) < 0.4 * side).astype(np.float32)
    return sector, inner


def _half_plane(rng: np.random.Generator, n: int, s: int, meander: float) -> np.ndarray:
    """1 on one side of a wavy line through the image (a shoreline), soft edge."""
    u, _ = _coords(rng, n, s)
    u0 = u[:, s // 2, s // 2][:, None, None] + rng.uniform(-s / 6, s / 6, size=(n, 1, 1))
    wave = meander * s * _smooth_noise(rng, n, s, s / 6)
    return _soft((u - u0 + wave) / (0.02 * s + 1), 4.0)


def _road(rng: np.random.Generator, n: int, s: int, width: tuple[float, float], u=None, v=None):
    """A straight road of width (fractions of S) through the centre, with centre dashes."""
    if u is None:
        u, v = _centred_uv(rng, n, s, jitter=0.1)
    w = rng.uniform(*width, size=(n, 1, 1)) * s
    road = np.clip(w / 2 - np.abs(v) + 0.5, 0, 1).astype(np.float32)
    dash = ((np.abs(v) < max(1.0, 0.006 * s)) & (np.mod(u, 0.12 * s) < 0.06 * s)).astype(np.float32)
    return road, dash * road, u, v


def _court(rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    u, v = _centred_uv(rng, n, s, jitter=0.1)
    hu = rng.uniform(0.25, 0.35, size=(n, 1, 1)) * s
    hv = hu * 0.5
    court = _box(u, v, hu, hv)
    lw = max(1.0, 0.008 * s)
    lines = (
        (
            (np.abs(np.abs(u) - hu * 0.85) < lw)
            | (np.abs(np.abs(v) - hv * 0.8) < lw)
            | (np.abs(u) < lw)
        )
        & (np.abs(u) < hu * 0.86)
        & (np.abs(v) < hv * 0.81)
    )
    return court, lines.astype(np.float32)


def _paint(
    rng: np.random.Generator, n: int, layers: list[tuple[str | np.ndarray, np.ndarray | float]]
) -> np.ndarray:
    """Alpha-blend coloured layers (first = background) into (n, 3, S, S) float32 in 0..1.

    A layer colour is a material name (jittered per image) or an explicit (n, 3) array; at
    least one layer's mask must be an array (it gives S)."""
    out: np.ndarray | None = None
    side = next(m.shape[-1] for _, m in layers if isinstance(m, np.ndarray))
    for colour, mask in layers:
        if isinstance(colour, str):
            rgb = np.asarray(_RGB[colour], np.float32)[None, :] * (
                1.0 + 0.08 * rng.standard_normal((n, 3)).astype(np.float32)
            )
        else:
            rgb = colour.astype(np.float32)
        rgb = rgb[:, :, None, None]
        if out is None:
            out = np.broadcast_to(rgb, (n, 3, side, side)).copy()
            continue
        m = mask if isinstance(mask, float) else mask[:, None, :, :]
        out = out + m * (rgb - out)
    assert out is not None
    return out.astype(np.float32, copy=False)


def _texture(rng: np.random.Generator, n: int, s: int, scale: float) -> np.ndarray:
    return _soft(_smooth_noise(rng, n, s, scale), 1.5)


def _class_images(cls: str, rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    """Clean images of one class, (n, 3, S, S) float32 in 0..1."""
    f = s / 256.0  # shapes are specified at the real 256-px scale
    if cls == "agricultural":
        rows = _stripes(rng, n, s, 6 * f + 2, 14 * f + 3)
        fields = _soft(_smooth_noise(rng, n, s, 40 * f), 2.0)
        return _paint(
            rng, n, [("soil", 1.0), ("grass", rows * fields), ("dry", rows * (1 - fields))]
        )
    if cls == "airplane":
        marks, _, _, _ = _road(rng, n, s, (0.005, 0.01))
        return _paint(
            rng,
            n,
            [
                ("concrete", 1.0),
                ("asphalt", 0.4 * _texture(rng, n, s, 30 * f)),
                ("white", 0.8 * marks),
                ("white", _airplane(rng, n, s)),
            ],
        )
    if cls == "baseballdiamond":
        sector, inner = _diamond(rng, n, s)
        return _paint(
            rng,
            n,
            [
                ("lawn", 1.0),
                ("tree", 0.3 * _texture(rng, n, s, 20 * f)),
                ("dry", sector),
                ("lawn", inner),
            ],
        )
    if cls == "beach":
        water = _half_plane(rng, n, s, 0.08)
        surf = np.clip(1 - np.abs(water - 0.5) * 3, 0, 1)
        return _paint(rng, n, [("sand", 1.0), ("water", water), ("white", 0.6 * surf)])
    if cls == "buildings":
        roofs = _rectangles(rng, n, s, 6)
        flat = _rectangles(rng, n, s, 3)
        return _paint(
            rng,
            n,
            [
                ("asphalt", 1.0),
                ("roof_grey", roofs),
                ("concrete", flat * (1 - roofs)),
                ("shadow", 0.5 * np.roll(roofs, 3, axis=2) * (1 - roofs)),
            ],
        )
    if cls == "chaparral":
        bushes = _soft(_smooth_noise(rng, n, s, 3 * f + 0.8) - 0.6, 3.0)
        return _paint(
            rng, n, [("dry", 1.0), ("shrub", _texture(rng, n, s, 15 * f)), ("tree", bushes)]
        )
    if cls == "denseresidential":
        houses, streets = _grid(rng, n, s, 18 * f + 4, 26 * f + 5, 0.7)
        trees = _soft(_smooth_noise(rng, n, s, 4 * f + 1) - 1.0, 3.0)
        return _paint(
            rng, n, [("grass", 1.0), ("roof_red", houses), ("asphalt", streets), ("tree", trees)]
        )
    if cls == "forest":
        crowns = _soft(_smooth_noise(rng, n, s, 5 * f + 1), 1.5)
        return _paint(rng, n, [("shadow", 1.0), ("tree", crowns), ("grass", 0.25 * crowns**4)])
    if cls == "freeway":
        road, dash, u, v = _road(rng, n, s, (0.3, 0.4))
        median = np.clip(0.02 * s - np.abs(v) + 0.5, 0, 1)
        lanes = (
            (np.abs(np.mod(v, 0.07 * s) - 0.035 * s) < max(0.6, 0.003 * s))
            & (np.mod(u, 0.1 * s) < 0.05 * s)
        ).astype(np.float32) * road
        side = _texture(rng, n, s, 20 * f)
        return _paint(
            rng,
            n,
            [
                ("grass", 1.0),
                ("dry", side),
                ("asphalt", road),
                ("white", lanes),
                ("concrete", median),
            ],
        )
    if cls == "golfcourse":
        fairway = _soft(_smooth_noise(rng, n, s, 30 * f), 1.5)
        bunkers = _disks(rng, n, s, 3, (0.03, 0.07))
        trees = _soft(_smooth_noise(rng, n, s, 6 * f + 1) - 0.9, 3.0) * (1 - fairway)
        return _paint(
            rng, n, [("grass", 1.0), ("lawn", fairway), ("sand", bunkers), ("tree", trees)]
        )
    if cls == "harbor":
        docks = _stripes(rng, n, s, 40 * f + 6, 60 * f + 8)
        piers = (docks > 0.93).astype(np.float32)
        boats = _dots(rng, n, s, 14 * f + 3, 20 * f + 4) * (docks > 0.6) * (docks < 0.9)
        return _paint(rng, n, [("water", 1.0), ("concrete", piers), ("white", boats)])
    if cls == "intersection":
        r1, d1, u, v = _road(rng, n, s, (0.12, 0.18))
        r2, d2, _, _ = _road(rng, n, s, (0.12, 0.18), u=v, v=u)
        lots = _rectangles(rng, n, s, 4)
        return _paint(
            rng,
            n,
            [
                ("grass", 1.0),
                ("roof_grey", lots),
                ("asphalt", np.maximum(r1, r2)),
                ("white", np.maximum(d1 * (1 - r2), d2 * (1 - r1))),
            ],
        )
    if cls == "mediumresidential":
        houses, streets = _grid(rng, n, s, 28 * f + 6, 38 * f + 7, 0.45)
        trees = _soft(_smooth_noise(rng, n, s, 5 * f + 1) - 0.6, 3.0)
        return _paint(
            rng, n, [("lawn", 1.0), ("roof_grey", houses), ("asphalt", streets), ("tree", trees)]
        )
    if cls == "mobilehomepark":
        u, v = _coords(rng, n, s)
        period_u = rng.uniform(22, 30, size=(n, 1, 1)) * f + 4
        period_v = rng.uniform(10, 14, size=(n, 1, 1)) * f + 2
        homes = (np.mod(u, period_u) < 0.75 * period_u) & (np.mod(v, period_v) < 0.55 * period_v)
        return _paint(
            rng,
            n,
            [
                ("asphalt", 1.0),
                ("dry", 0.4 * _texture(rng, n, s, 10 * f)),
                ("white", homes.astype(np.float32)),
            ],
        )
    if cls == "overpass":
        r1, d1, u, v = _road(rng, n, s, (0.15, 0.22))
        r2, d2, _, _ = _road(rng, n, s, (0.15, 0.22), u=v, v=u)
        shadow = np.roll(r2, int(0.04 * s) + 1, axis=1) * (1 - r2)
        return _paint(
            rng,
            n,
            [
                ("dry", 1.0),
                ("asphalt", r1),
                ("white", d1),
                ("shadow", 0.7 * shadow),
                ("concrete", r2),
                ("white", d2),
            ],
        )
    if cls == "parkinglot":
        u, v = _coords(rng, n, s)
        pu = rng.uniform(9, 12, size=(n, 1, 1)) * f + 2
        pv = rng.uniform(40, 50, size=(n, 1, 1)) * f + 6
        slot = (np.mod(u, pu) < 0.6 * pu) & (np.mod(v, pv) < 0.4 * pv)
        occupied = slot & (_smooth_noise(rng, n, s, 1.0) > -0.3)
        colours = rng.uniform(0.1, 0.95, size=(n, 3)).astype(np.float32)
        return _paint(
            rng,
            n,
            [
                ("asphalt", 1.0),
                (colours, occupied.astype(np.float32)),
                ("white", 0.5 * occupied * (_smooth_noise(rng, n, s, 1.0) > 0.5)),
            ],
        )
    if cls == "river":
        land = _texture(rng, n, s, 15 * f)
        water = _line(rng, n, s, (40 * f + 4, 80 * f + 6), meander=s / 8)
        return _paint(rng, n, [("grass", 1.0), ("tree", land), ("water", water)])
    if cls == "runway":
        road, dash, u, v = _road(rng, n, s, (0.35, 0.5))
        edges = (np.abs(np.abs(v) - 0.16 * s) < max(1.0, 0.01 * s)).astype(np.float32) * road
        return _paint(
            rng,
            n,
            [
                ("grass", 1.0),
                ("dry", 0.5 * _texture(rng, n, s, 25 * f)),
                ("concrete", road),
                ("white", np.maximum(dash * 3, edges).clip(0, 1)),
            ],
        )
    if cls == "sparseresidential":
        u, v = _coords(rng, n, s)
        houses = _disks(rng, n, s, 4, (0.04, 0.07))
        houses = (houses > 0.5).astype(np.float32)
        trees = _soft(_smooth_noise(rng, n, s, 6 * f + 1) - 0.8, 3.0)
        return _paint(
            rng,
            n,
            [
                ("grass", 1.0),
                ("dry", 0.5 * _texture(rng, n, s, 20 * f)),
                ("tree", trees),
                ("roof_red", houses),
            ],
        )
    if cls == "storagetanks":
        tanks = _disks(rng, n, s, 6, (0.06, 0.12))
        rims = np.clip(1 - np.abs(tanks - 0.5) * 2.2, 0, 1)
        return _paint(
            rng,
            n,
            [
                ("soil", 1.0),
                ("concrete", 0.5 * _texture(rng, n, s, 20 * f)),
                ("white", tanks),
                ("roof_grey", 0.6 * rims),
            ],
        )
    if cls == "tenniscourt":
        court, lines = _court(rng, n, s)
        blue = (rng.random((n, 1, 1)) < 0.5).astype(np.float32)
        return _paint(
            rng,
            n,
            [
                ("lawn", 1.0),
                ("tree", 0.4 * _texture(rng, n, s, 12 * f)),
                ("court_green", court),
                ("court_blue", court * blue),
                ("white", lines),
            ],
        )
    raise AssertionError(cls)  # pragma: no cover


def _to_uint8(clean: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Brightness/contrast jitter per image, pixel noise, quantisation; (n, 3, S, S) uint8."""
    n = clean.shape[0]
    gain = rng.uniform(0.8, 1.2, size=(n, 1, 1, 1)).astype(np.float32)
    offset = rng.uniform(-0.05, 0.05, size=(n, 1, 1, 1)).astype(np.float32)
    noise = 0.025 * rng.standard_normal(clean.shape, dtype=np.float32)
    img = (clean * gain + offset + noise) * 255.0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------------------- generator


def generate_uc_merced(
    root: str | os.PathLike[str],
    *,
    samples_per_class: int = 100,
    seed: int = 0,
    size: int = 256,
    varying_fraction: float = 0.25,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Path:
    """Write a synthetic UC Merced in torchgeo's real on-disk layout under ``root``; return it.

    Args:
        root: Target directory (cached and atomic, see
            :func:`~raytrain_hetero.workloads.generated_tree.generate_tree`; a real dataset
            there is never touched).
        samples_per_class: Images per class (the real set has 100); >= 3.
        seed: Generator seed; output is deterministic given all arguments.
        size: Side of a full image in pixels (real: 256); >= 32.
        varying_fraction: Fraction of images cut 1-8 % shorter in one dimension, as some of
            the real images are (torchgeo resizes all to 256 x 256).
        split_fractions: Train/val/test fractions per class (torchgeo's own split of the
            real data is 60/20/20).

    Raises:
        ConfigError: Invalid arguments.
        DataError: ``root`` is a file or a foreign non-empty directory.
    """
    what = "generate_uc_merced"
    check_integers(what, ("samples_per_class", samples_per_class, 3), ("seed", seed, 0))
    check_integers(what, ("size", size, 32))
    fr = check_split_fractions(what, split_fractions)
    if not 0.0 <= varying_fraction <= 1.0:
        raise ConfigError(
            f"generate_uc_merced: varying_fraction must be in [0, 1], got {varying_fraction}"
        )
    counts = split_counts(what, samples_per_class, fr)
    params = {
        "generator": "raytrain_hetero.workloads.uc_merced",
        "version": _GENERATOR_VERSION,
        "samples_per_class": int(samples_per_class),
        "seed": int(seed),
        "size": int(size),
        "varying_fraction": float(varying_fraction),
        "split_fractions": list(fr),
    }

    def write(tmp: Path) -> None:
        from PIL import Image

        spc = int(samples_per_class)
        digits = max(2, len(str(spc - 1)))
        lines: dict[str, list[str]] = {s: [] for s in UCMERCED_SPLITS}
        for ci, cls in enumerate(UCMERCED_CLASSES):
            cdir = tmp / _BASE_DIR / cls
            cdir.mkdir(parents=True)
            for split, members in split_members(seed, ci, counts).items():
                lines[split].extend(f"{cls}{k:0{digits}d}.tif" for k in members)
            for start in range(0, spc, _CHUNK):
                n = min(_CHUNK, spc - start)
                rng = np.random.default_rng([seed, ci, 0, start // _CHUNK])
                images = _to_uint8(_class_images(cls, rng, n, size), rng)
                shrink = rng.random(n) < varying_fraction
                cut = rng.integers(max(1, size // 100), max(2, size * 8 // 100) + 1, size=n)
                axis = rng.integers(0, 2, size=n)
                for j in range(n):
                    h = w = size
                    if shrink[j]:
                        if axis[j] == 0:
                            h -= int(cut[j])
                        else:
                            w -= int(cut[j])
                    chip = np.ascontiguousarray(images[j, :, :h, :w].transpose(1, 2, 0))
                    Image.fromarray(chip, mode="RGB").save(
                        cdir / f"{cls}{start + j:0{digits}d}.tif", format="TIFF"
                    )
        for split, names in lines.items():
            (tmp / _SPLIT_FILE.format(split=split)).write_text("\n".join(names) + "\n")

    return generate_tree(root, params, write, what="generate_uc_merced")
