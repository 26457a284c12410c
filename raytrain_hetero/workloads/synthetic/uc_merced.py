"""Synthetic UC Merced in torchgeo's real on-disk layout (RGB TIFFs of 21 classes, split files).

Each class is a scene layout drawn from shapes (roads, roofs, courts, water, trees ...) painted
in 1-ft aerial colours, with per-image colour, brightness and layout jitter plus pixel noise, so
that a CNN has to learn shapes and textures, not just colours; some images are cut slightly
shorter, as some real ones are. The layout is :mod:`~raytrain_hetero.workloads.formats`'; the
loader stays torchgeo's own (:func:`~raytrain_hetero.workloads.uc_merced.uc_merced_datasets`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.formats import (
    UCMERCED_CLASSES,
    UCMERCED_IMAGE_DIR,
    UCMERCED_SPLIT_FILE,
    uc_merced_file_name,
)
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.synthetic import drawing as d
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    class_chunks,
    split_counts,
    write_split_lists,
)

_GENERATOR_VERSION = 2
_CHUNK = 16  # images per vectorised batch (part of the deterministic recipe)

# Colours of 1-ft aerial RGB materials (linear 0..1).
_RGB_VALUES = {
    "grass": (0.40, 0.50, 0.28), "lawn": (0.45, 0.60, 0.30), "tree": (0.16, 0.26, 0.14),
    "shadow": (0.08, 0.10, 0.09), "shrub": (0.46, 0.43, 0.31), "soil": (0.56, 0.46, 0.36),
    "dry": (0.66, 0.58, 0.44), "sand": (0.86, 0.80, 0.64), "water": (0.14, 0.24, 0.30),
    "asphalt": (0.33, 0.33, 0.35), "concrete": (0.66, 0.66, 0.63),
    "roof_red": (0.58, 0.32, 0.26), "roof_grey": (0.50, 0.50, 0.53),
    "white": (0.93, 0.93, 0.92), "court_green": (0.24, 0.50, 0.36),
    "court_blue": (0.22, 0.36, 0.58),
}  # fmt: skip
_RGB = {name: np.asarray(rgb, np.float32) for name, rgb in _RGB_VALUES.items()}


# ----------------------------------------------------------------------------- shapes
# Every shape function returns float32 masks in [0, 1] of shape (n, S, S).


def _airplane(rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    u, v = d.coords(rng, n, s, centred=True)
    length = rng.uniform(0.25, 0.4, size=(n, 1, 1)) * s
    span = length * rng.uniform(0.8, 1.0, size=(n, 1, 1))
    fuselage = d.boxes(u, v, length / 2, length * 0.06)
    wings = d.boxes(u + length * 0.05, v, length * 0.07, span / 2)
    tail = d.boxes(u + length * 0.42, v, length * 0.04, span * 0.18)
    return np.maximum(np.maximum(fuselage, wings), tail)


def _diamond(rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Infield dirt (a quarter disc around the diamond) and the grass inside the diamond."""
    u, v = d.coords(rng, n, s, centred=True, jitter=0.1)
    side = rng.uniform(0.22, 0.32, size=(n, 1, 1)) * s
    dist = np.sqrt(u**2 + v**2)
    sector = (u > -0.05 * s) & (np.abs(v) < u + 0.05 * s) & (dist < side * 1.35)
    inner = (np.abs(u - side / 2) + np.abs(v)) < 0.4 * side
    return sector.astype(np.float32), inner.astype(np.float32)


def _half_plane(rng: np.random.Generator, n: int, s: int, meander: float) -> np.ndarray:
    """1 on one side of a wavy line through the image (a shoreline), soft edge."""
    u, _ = d.coords(rng, n, s)
    u0 = u[:, s // 2, s // 2][:, None, None] + rng.uniform(-s / 6, s / 6, size=(n, 1, 1))
    wave = meander * s * d.smooth_noise(rng, n, s, s / 6)
    return d.soft((u - u0 + wave) / (0.02 * s + 1), 4.0)


def _road(
    rng: np.random.Generator, n: int, s: int, width: tuple[float, float], uv: tuple | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A straight road of width (fractions of S) through the centre, with centre dashes;
    returns (road, dashes, u, v)."""
    u, v = d.coords(rng, n, s, centred=True, jitter=0.1) if uv is None else uv
    w = rng.uniform(*width, size=(n, 1, 1)) * s
    road = np.clip(w / 2 - np.abs(v) + 0.5, 0, 1).astype(np.float32)
    dash = (np.abs(v) < max(1.0, 0.006 * s)) & (np.mod(u, 0.12 * s) < 0.06 * s)
    return road, dash * road, u, v


def _court(rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    u, v = d.coords(rng, n, s, centred=True, jitter=0.1)
    hu = rng.uniform(0.25, 0.35, size=(n, 1, 1)) * s
    hv = hu * 0.5
    lw = max(1.0, 0.008 * s)
    marked = (np.abs(np.abs(u) - hu * 0.85) < lw) | (np.abs(np.abs(v) - hv * 0.8) < lw)
    lines = (marked | (np.abs(u) < lw)) & (np.abs(u) < hu * 0.86) & (np.abs(v) < hv * 0.81)
    return d.boxes(u, v, hu, hv), lines.astype(np.float32)


def _lattice(
    rng: np.random.Generator, n: int, s: int, periods: tuple[tuple[float, float], ...], fills
) -> np.ndarray:
    """Rotated rectangular lattice (homes, parking slots): periods (px) and fill fractions."""
    u, v = d.coords(rng, n, s)
    pu, pv = (rng.uniform(lo, hi, size=(n, 1, 1)) for lo, hi in periods)
    return (np.mod(u, pu) < fills[0] * pu) & (np.mod(v, pv) < fills[1] * pv)


def _class_images(cls: str, rng: np.random.Generator, n: int, s: int) -> np.ndarray:
    """Clean images of one class, (n, 3, S, S) float32 in 0..1."""
    f = s / 256.0  # shapes are specified at the real 256-px scale

    def texture(scale: float, threshold: float = 0.0, sharpness: float = 1.5) -> np.ndarray:
        return d.soft(d.smooth_noise(rng, n, s, scale) - threshold, sharpness)

    layers: list[tuple[str | np.ndarray, np.ndarray | float]]
    if cls == "agricultural":
        rows = d.stripes(rng, n, s, 6 * f + 2, 14 * f + 3)
        fields = texture(40 * f, sharpness=2.0)
        layers = [("soil", 1.0), ("grass", rows * fields), ("dry", rows * (1 - fields))]
    elif cls == "airplane":
        marks = _road(rng, n, s, (0.005, 0.01))[0]
        ground = 0.4 * texture(30 * f)
        layers = [("concrete", 1.0), ("asphalt", ground), ("white", 0.8 * marks)]
        layers.append(("white", _airplane(rng, n, s)))
    elif cls == "baseballdiamond":
        sector, inner = _diamond(rng, n, s)
        layers = [("lawn", 1.0), ("tree", 0.3 * texture(20 * f)), ("dry", sector), ("lawn", inner)]
    elif cls == "beach":
        water = _half_plane(rng, n, s, 0.08)
        surf = np.clip(1 - np.abs(water - 0.5) * 3, 0, 1)
        layers = [("sand", 1.0), ("water", water), ("white", 0.6 * surf)]
    elif cls == "buildings":
        roofs, flat = d.rectangles(rng, n, s, 6), d.rectangles(rng, n, s, 3)
        shade = 0.5 * np.roll(roofs, 3, axis=2) * (1 - roofs)
        layers = [("asphalt", 1.0), ("roof_grey", roofs), ("concrete", flat * (1 - roofs))]
        layers.append(("shadow", shade))
    elif cls == "chaparral":
        bushes = texture(3 * f + 0.8, 0.6, 3.0)
        layers = [("dry", 1.0), ("shrub", texture(15 * f)), ("tree", bushes)]
    elif cls in ("denseresidential", "mediumresidential"):
        dense = cls == "denseresidential"
        lo, hi, fill = (18 * f + 4, 26 * f + 5, 0.7) if dense else (28 * f + 6, 38 * f + 7, 0.45)
        houses, streets = d.grid(rng, n, s, lo, hi, fill)
        trees = texture((4 if dense else 5) * f + 1, 1.0 if dense else 0.6, 3.0)
        roof = "roof_red" if dense else "roof_grey"
        layers = [("grass" if dense else "lawn", 1.0), (roof, houses), ("asphalt", streets)]
        layers.append(("tree", trees))
    elif cls == "forest":
        crowns = texture(5 * f + 1)
        layers = [("shadow", 1.0), ("tree", crowns), ("grass", 0.25 * crowns**4)]
    elif cls == "freeway":
        road, _, u, v = _road(rng, n, s, (0.3, 0.4))
        median = np.clip(0.02 * s - np.abs(v) + 0.5, 0, 1)
        lane = np.abs(np.mod(v, 0.07 * s) - 0.035 * s) < max(0.6, 0.003 * s)
        lanes = (lane & (np.mod(u, 0.1 * s) < 0.05 * s)) * road
        layers = [("grass", 1.0), ("dry", texture(20 * f)), ("asphalt", road)]
        layers += [("white", lanes), ("concrete", median)]
    elif cls == "golfcourse":
        fairway = texture(30 * f)
        bunkers = d.disks(rng, n, s, 3, (0.03, 0.07))
        trees = texture(6 * f + 1, 0.9, 3.0) * (1 - fairway)
        layers = [("grass", 1.0), ("lawn", fairway), ("sand", bunkers), ("tree", trees)]
    elif cls == "harbor":
        docks = d.stripes(rng, n, s, 40 * f + 6, 60 * f + 8)
        boats = d.dots(rng, n, s, 14 * f + 3, 20 * f + 4) * (docks > 0.6) * (docks < 0.9)
        layers = [("water", 1.0), ("concrete", (docks > 0.93) * 1.0), ("white", boats)]
    elif cls in ("intersection", "overpass"):
        over = cls == "overpass"
        width = (0.15, 0.22) if over else (0.12, 0.18)
        r1, d1, u, v = _road(rng, n, s, width)
        r2, d2, _, _ = _road(rng, n, s, width, uv=(v, u))
        if over:  # a bridge casting a shadow across the road below
            shadow = np.roll(r2, int(0.04 * s) + 1, axis=1) * (1 - r2)
            layers = [("dry", 1.0), ("asphalt", r1), ("white", d1), ("shadow", 0.7 * shadow)]
            layers += [("concrete", r2), ("white", d2)]
        else:
            lots = d.rectangles(rng, n, s, 4)
            marks = np.maximum(d1 * (1 - r2), d2 * (1 - r1))
            layers = [("grass", 1.0), ("roof_grey", lots), ("asphalt", np.maximum(r1, r2))]
            layers.append(("white", marks))
    elif cls == "mobilehomepark":
        homes = _lattice(
            rng, n, s, ((22 * f + 4, 30 * f + 4), (10 * f + 2, 14 * f + 2)), (0.75, 0.55)
        )
        layers = [("asphalt", 1.0), ("dry", 0.4 * texture(10 * f)), ("white", homes * 1.0)]
    elif cls == "parkinglot":
        slot = _lattice(rng, n, s, ((9 * f + 2, 12 * f + 2), (40 * f + 6, 50 * f + 6)), (0.6, 0.4))
        occupied = slot & (d.smooth_noise(rng, n, s, 1.0) > -0.3)
        colours = rng.uniform(0.1, 0.95, size=(n, 3)).astype(np.float32)
        glare = 0.5 * occupied * (d.smooth_noise(rng, n, s, 1.0) > 0.5)
        layers = [("asphalt", 1.0), (colours, occupied * 1.0), ("white", glare)]
    elif cls == "river":
        water = d.line(rng, n, s, (40 * f + 4, 80 * f + 6), meander=s / 8)
        layers = [("grass", 1.0), ("tree", texture(15 * f)), ("water", water)]
    elif cls == "runway":
        road, dash, _, v = _road(rng, n, s, (0.35, 0.5))
        edges = (np.abs(np.abs(v) - 0.16 * s) < max(1.0, 0.01 * s)) * road
        marks = np.maximum(dash * 3, edges).clip(0, 1)
        layers = [("grass", 1.0), ("dry", 0.5 * texture(25 * f)), ("concrete", road)]
        layers.append(("white", marks))
    elif cls == "sparseresidential":
        houses = (d.disks(rng, n, s, 4, (0.04, 0.07)) > 0.5) * 1.0
        trees = texture(6 * f + 1, 0.8, 3.0)
        layers = [("grass", 1.0), ("dry", 0.5 * texture(20 * f)), ("tree", trees)]
        layers.append(("roof_red", houses))
    elif cls == "storagetanks":
        tanks = d.disks(rng, n, s, 6, (0.06, 0.12))
        rims = np.clip(1 - np.abs(tanks - 0.5) * 2.2, 0, 1)
        layers = [("soil", 1.0), ("concrete", 0.5 * texture(20 * f)), ("white", tanks)]
        layers.append(("roof_grey", 0.6 * rims))
    elif cls == "tenniscourt":
        court, lines = _court(rng, n, s)
        blue = (rng.random((n, 1, 1)) < 0.5).astype(np.float32)
        layers = [("lawn", 1.0), ("tree", 0.4 * texture(12 * f)), ("court_green", court)]
        layers += [("court_blue", court * blue), ("white", lines)]
    else:  # pragma: no cover
        raise AssertionError(cls)
    return d.paint(rng, n, _RGB, layers, jitter=0.08)


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
        raise ConfigError(f"{what}: varying_fraction must be in [0, 1], got {varying_fraction}")
    counts = split_counts(what, samples_per_class, fr)
    spc, seed, size = int(samples_per_class), int(seed), int(size)
    params = {
        "generator": "raytrain_hetero.workloads.uc_merced",
        "version": _GENERATOR_VERSION,
        "samples_per_class": spc,
        "seed": seed,
        "size": size,
        "varying_fraction": float(varying_fraction),
        "split_fractions": list(fr),
    }
    digits = max(2, len(str(spc - 1)))

    def name(cls: str, k: int) -> str:
        return uc_merced_file_name(cls, k, digits)

    def write(tmp: Path) -> None:
        from PIL import Image

        write_split_lists(tmp, UCMERCED_SPLIT_FILE, seed, UCMERCED_CLASSES, counts, name)
        for _, cls, start, n, rng in class_chunks(seed, UCMERCED_CLASSES, spc, _CHUNK):
            cdir = tmp / UCMERCED_IMAGE_DIR / cls
            cdir.mkdir(parents=True, exist_ok=True)
            clean = 255.0 * _class_images(cls, rng, n, size)
            images = d.quantise(
                clean, rng, gain=(0.8, 1.2), relative=0.0, additive=6.4, dtype=np.uint8, lowest=0
            )
            shrink = rng.random(n) < varying_fraction
            cut = rng.integers(max(1, size // 100), max(2, size * 8 // 100) + 1, size=n)
            axis = rng.integers(0, 2, size=n)
            for j in range(n):
                h = size - int(cut[j]) if shrink[j] and axis[j] == 0 else size
                w = size - int(cut[j]) if shrink[j] and axis[j] == 1 else size
                chip = np.ascontiguousarray(images[j, :, :h, :w].transpose(1, 2, 0))
                Image.fromarray(chip, mode="RGB").save(cdir / name(cls, start + j), format="TIFF")

    return generate_tree(root, params, write, what=what)
