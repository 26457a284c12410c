"""Synthetic hyperspectral scene (Indian Pines / Pavia style) as ``.mat`` or GeoTIFF files.

Smooth class regions with class-typical spectra mixed from endmembers, noise and
illumination changes; read back by
:func:`~raytrain_hetero.workloads.hyperspectral.load_hyperspectral_scene`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.synthetic import drawing as d
from raytrain_hetero.workloads.synthetic.arguments import check_integers, write_geotiff

_GENERATOR_VERSION = 2


# ================================================================================ generator


def _gauss(lam: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((lam - centre) / width) ** 2)


def _endmembers(lam: np.ndarray) -> np.ndarray:
    """Reflectance of 5 base materials, (5, C): green vegetation, dry vegetation, soil,
    water, man-made (asphalt/concrete)."""
    water_abs = (
        1 - 0.55 * _gauss(lam, 1450, 60) - 0.7 * _gauss(lam, 1940, 80) - 0.2 * _gauss(lam, 970, 30)
    )
    green = (
        0.04
        + 0.05 * _gauss(lam, 550, 35)
        + 0.45 / (1 + np.exp(-(lam - 715) / 14))
        - 0.15 * np.clip((lam - 1300) / 1200, 0, 1)
    ) * water_abs
    dry = (0.12 + 0.25 * np.clip((lam - 400) / 900, 0, 1) - 0.08 * _gauss(lam, 2100, 60)) * (
        1 - 0.3 * _gauss(lam, 1940, 80)
    )
    soil = (0.08 + 0.22 * np.clip((lam - 400) / 1800, 0, 1) - 0.05 * _gauss(lam, 2200, 40)) * (
        1 - 0.25 * _gauss(lam, 1450, 60) - 0.35 * _gauss(lam, 1940, 80)
    )
    water = 0.07 * np.exp(-(lam - 400) / 250) + 0.005
    manmade = 0.12 + 0.04 * np.clip((lam - 400) / 2100, 0, 1) - 0.02 * _gauss(lam, 1700, 80)
    return np.clip(np.stack([green, dry, soil, water, manmade]), 0.002, 1.0)


def _class_spectra(
    lam: np.ndarray, num_classes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Abundances (K+1, 5) of each class (row 0 = background) and a multiplicative class
    signature (K+1, C): a shifted red edge and one narrow absorption feature per class."""
    dominant = rng.permutation(np.resize(np.array([0, 0, 1, 2, 3, 4, 0, 2]), num_classes + 1))
    abundances = rng.dirichlet(np.full(5, 0.6), size=num_classes + 1)
    abundances[np.arange(num_classes + 1), dominant] += 1.5
    abundances /= abundances.sum(axis=1, keepdims=True)
    signature = np.ones((num_classes + 1, lam.size))
    for c in range(num_classes + 1):
        centre = rng.uniform(450, 2400)
        signature[c] *= 1 - rng.uniform(0.04, 0.12) * _gauss(lam, centre, rng.uniform(15, 40))
        signature[c] *= 1 + rng.uniform(-0.06, 0.06) * np.clip((lam - 700) / 300, 0, 1)
    return abundances, signature


def _smooth(rng: np.random.Generator, h: int, w: int, scale: float) -> np.ndarray:
    return d.smooth_noise(rng, 1, h, scale, width=w)[0].astype(np.float64)


def _scene_layout(
    rng: np.random.Generator, h: int, w: int, num_classes: int, region_px: float, unlabelled: float
) -> tuple[np.ndarray, np.ndarray]:
    """Warped-Voronoi fields: (region id map, class of each region; 0 = background)."""
    n_regions = max(2 * num_classes + 2, round(h * w / region_px**2))
    seeds = rng.uniform([0, 0], [h, w], size=(n_regions, 2))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    yy = yy + 0.25 * region_px * _smooth(rng, h, w, region_px / 2)
    xx = xx + 0.25 * region_px * _smooth(rng, h, w, region_px / 2)
    from scipy.spatial import cKDTree

    _, nearest = cKDTree(seeds).query(np.stack([yy.ravel(), xx.ravel()], axis=1))
    region = nearest.reshape(h, w).astype(np.int64)
    n_bg = round(unlabelled * n_regions)
    classes = np.concatenate(
        [
            np.zeros(n_bg, dtype=np.int64),
            np.tile(np.arange(1, num_classes + 1), 2),
        ]
    )
    rest = n_regions - classes.size
    if rest > 0:  # imbalanced class frequencies, as in the real scenes
        weights = rng.dirichlet(np.full(num_classes, 1.0))
        classes = np.concatenate(
            [classes, rng.choice(np.arange(1, num_classes + 1), size=rest, p=weights)]
        )
    return region, rng.permutation(classes[:n_regions])


def _render_scene(params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(cube (H, W, C) uint16 DN = reflectance * 10000, labels (H, W) uint8)."""
    from scipy.ndimage import gaussian_filter

    h, w, c, k = params["height"], params["width"], params["bands"], params["classes"]
    rng = np.random.default_rng([params["seed"], 31337])
    lam = np.linspace(400.0, 2500.0, c, dtype=np.float64)  # band centres (nm)
    ends = _endmembers(lam)
    class_abund, class_sig = _class_spectra(lam, k, rng)
    region, region_class = _scene_layout(
        rng, h, w, k, params["region_size"], params["unlabelled_fraction"]
    )
    # Background regions get spectra of "other" cover types (not any labelled class).
    bg_abund = rng.dirichlet(np.full(5, 0.8), size=region_class.size)
    abund_r = np.where((region_class > 0)[:, None], class_abund[region_class], bg_abund)
    # Field-to-field variability (soil moisture, growth stage): same class, different field.
    abund_r = abund_r * np.exp(0.25 * rng.standard_normal(abund_r.shape))
    abund_r /= abund_r.sum(axis=1, keepdims=True)
    bright_r = rng.uniform(0.9, 1.1, size=region_class.size)
    abund = abund_r[region]  # (H, W, 5)
    # Within-field texture: smooth variation of every abundance.
    for e in range(5):
        abund[:, :, e] *= np.exp(0.2 * _smooth(rng, h, w, 2.0))
    abund /= abund.sum(axis=2, keepdims=True)
    cube = abund @ ends  # (H, W, C)
    cube *= class_sig[np.where(region_class > 0, region_class, 0)[region]]
    cube *= bright_r[region][:, :, None]
    cube = gaussian_filter(cube, sigma=(0.6, 0.6, 0))  # sensor PSF: mixed pixels at edges
    # Noise: low SNR in the atmospheric water-vapour bands.
    sigma = 0.004 + 0.02 * (_gauss(lam, 1400, 50) + _gauss(lam, 1900, 60))
    cube += rng.standard_normal(cube.shape) * sigma[None, None, :]
    dn = np.clip(np.rint(cube * 10000), 1, 65535).astype(np.uint16)
    labels = region_class[region].astype(np.uint8)
    # Field borders are not labelled in the public ground truths.
    from scipy.ndimage import maximum_filter, minimum_filter

    border = maximum_filter(region, size=3) != minimum_filter(region, size=3)
    labels[border] = 0
    return dn, labels


def generate_hyperspectral_scene(
    root: str | os.PathLike[str],
    *,
    name: str = "Synthetic_pines",
    height: int = 145,
    width: int = 145,
    bands: int = 200,
    classes: int = 16,
    file_format: Literal["mat", "tif", "l7irish"] = "mat",
    seed: int = 0,
    region_size: float = 14.0,
    unlabelled_fraction: float = 0.3,
) -> Path:
    """Write a synthetic hyperspectral scene in a public scene's on-disk format; return ``root``.

    ``file_format="mat"`` writes ``<name>_corrected.mat`` (variable ``<name lower>_corrected``,
    ``H x W x C`` uint16) and ``<name>_gt.mat`` (``<name lower>_gt``, ``H x W`` uint8), like
    ``Indian_pines_corrected.mat`` / ``Indian_pines_gt.mat``; ``"tif"`` writes
    ``<name>.tif`` (C-band uint16 GeoTIFF, UTM 15N, 2.5 m pixels like Houston 2013) and
    ``<name>_gt.tif``. :func:`find_scene_files` finds both layouts.
    ``"l7irish"`` writes the layout of torchgeo's ``L7Irish`` (read by
    ``torchgeo.datasets.L7Irish`` / ``L7IrishDataModule`` with ``paths=root``): a
    ``height x 5 width`` scene cut into five adjacent ``width``-wide scenes as ``L71<path><row>_<row><date>.TIF`` (``bands`` must
    be 9, ETM+ B10..B80) and ``L7_p<path>_r<row>_newmask2015.TIF`` (classes 1..4 written as
    64/128/192/255, 0 = Fill), so ``classes`` <= 4.

    The scene is a mosaic of warped-Voronoi fields (about ``region_size`` px across), each
    of one class or unlabelled background (``unlabelled_fraction`` of the fields, plus all
    field borders, are 0). A class is a mixture of five base materials (green and dry
    vegetation, soil, water, man-made) with its own narrow absorption feature and red-edge
    tilt; every field perturbs the mixture and brightness (so fields of one class differ),
    with smooth within-field texture, a sensor blur and band-dependent noise (noisy
    water-vapour bands). Spatially blocked evaluation is therefore harder than random
    pixels, as on the real scenes. Cached and atomic like every generator here.

    Raises:
        ConfigError: Invalid arguments.
        DataError: ``root`` is a file or a foreign non-empty directory.
    """
    check_integers(
        "generate_hyperspectral_scene",
        ("height", height, 8),
        ("width", width, 8),
        ("bands", bands, 4),
        ("classes", classes, 2),
        ("seed", seed, 0),
    )
    if classes > 255:
        raise ConfigError("generate_hyperspectral_scene: classes must be <= 255 (uint8 labels)")
    if file_format not in ("mat", "tif", "l7irish"):
        raise ConfigError(
            "generate_hyperspectral_scene: file_format must be 'mat', 'tif' or 'l7irish', "
            f"got {file_format!r}"
        )
    if file_format == "l7irish" and (bands != 9 or classes > 4):
        raise ConfigError(
            "generate_hyperspectral_scene: file_format 'l7irish' needs 9 bands (ETM+) and "
            f"classes <= 4, got {bands} bands, {classes} classes"
        )
    if not name or any(ch in name for ch in "/\\. "):
        raise ConfigError(
            f"generate_hyperspectral_scene: name must be a plain file stem, got {name!r}"
        )
    if not 0 <= unlabelled_fraction < 1 or region_size < 2:
        raise ConfigError(
            "generate_hyperspectral_scene: need 0 <= unlabelled_fraction < 1 and region_size >= 2"
        )
    params = {
        "generator": "raytrain_hetero.workloads.hyperspectral",
        "version": _GENERATOR_VERSION,
        "name": name,
        "height": int(height),
        "width": int(width),
        "bands": int(bands),
        "classes": int(classes),
        "file_format": file_format,
        "seed": int(seed),
        "region_size": float(region_size),
        "unlabelled_fraction": float(unlabelled_fraction),
    }

    def write(tmp: Path) -> None:
        if file_format == "mat":
            dn, labels = _render_scene(params)
            import scipy.io

            scipy.io.savemat(tmp / f"{name}_corrected.mat", {f"{name.lower()}_corrected": dn})
            scipy.io.savemat(tmp / f"{name}_gt.mat", {f"{name.lower()}_gt": labels})
        elif file_format == "l7irish":  # one field mosaic cut into 5 scenes, 30 m pixels
            dn, labels = _render_scene({**params, "width": 5 * width})
            codes = np.array([0, 64, 128, 192, 255], dtype=np.uint8)  # L7Irish's mask values
            for k in range(5):
                cols = slice(k * width, (k + 1) * width)
                grid = {"epsg": 32615, "origin": (268_000.0 + k * width * 30, 3_290_000.0)}
                scene = f"L71{k + 1:03d}{k + 1:03d}_{k + 1:03d}200011{k + 10}.TIF"
                image = np.ascontiguousarray(dn[:, cols].transpose(2, 0, 1))
                write_geotiff(tmp / scene, image, **grid, pixel=30.0)
                mask = codes[labels[None, :, cols]]
                write_geotiff(
                    tmp / f"L7_p{k + 1}_r{k + 1}_newmask2015.TIF", mask, **grid, pixel=30.0
                )
        else:  # UTM 15N, 2.5 m pixels, like Houston 2013
            dn, labels = _render_scene(params)
            grid = {"epsg": 32615, "origin": (268_000.0, 3_290_000.0), "pixel": 2.5}
            write_geotiff(tmp / f"{name}.tif", np.ascontiguousarray(dn.transpose(2, 0, 1)), **grid)
            write_geotiff(tmp / f"{name}_gt.tif", labels[None], **grid)

    return generate_tree(root, params, write, what="generate_hyperspectral_scene")
