"""Hyperspectral scene patch classification (Indian Pines / Pavia University / Houston style).

A *scene* is one image cube ``H x W x C`` (C narrow bands) plus a label map ``H x W`` where
``0`` means unlabelled and ``1..K`` are classes. Each labelled pixel is one sample: the
``k x k x C`` patch around it (reflect-padded at the image border), labelled with the centre
pixel's class (``label - 1``, so classes are ``0..K-1``). This is the spectral-spatial setup
of the seed group's hyperspectral CNNs.

On disk (what the public scenes ship as, and what :func:`generate_hyperspectral_scene` writes):

* MATLAB ``.mat`` (v5/v7, read with ``scipy.io.loadmat``): ``Indian_pines_corrected.mat``
  holding the cube under ``indian_pines_corrected`` and ``Indian_pines_gt.mat`` holding the
  map under ``indian_pines_gt``; ``PaviaU.mat`` / ``PaviaU_gt.mat`` (keys ``paviaU``,
  ``paviaU_gt``); Salinas likewise. MATLAB v7.3 files are HDF5 and need h5py.
* GeoTIFF (read with rasterio): the cube as a C-band raster, the label map as a one-band
  raster on the same grid (Houston 2013 style); the class map predicted for a GeoTIFF scene
  keeps its georeference.

Splits (:func:`split_scene_pixels`):

* ``"block"`` (the default): the scene is cut into ``block_size`` squares, whole blocks go to
  train/val/test (greedily balanced per class), and with ``guard=True`` a centre is kept only
  if its whole ``k x k`` patch lies inside blocks of its own split. This is the *honest*
  split: with random pixels, a test pixel's neighbours -- whose patches contain the test
  pixel itself -- are in the training set, so test accuracy measures interpolation between
  overlapping patches and is strongly inflated (Liang et al., "On the sampling strategy for
  evaluation of spectral-spatial methods in hyperspectral image classification", IEEE TGRS
  2017; Hänsch et al. 2017).
* ``"random"``: stratified random pixels (the common but optimistic protocol), for
  comparison with published numbers.

Either way no pixel is the centre of a sample in two splits. Per-band normalisation uses the
mean/std of the *training* centre pixels only, cached as JSON (see
:mod:`~raytrain_hetero.workloads.normalization`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.file_checks import unreadable_message
from raytrain_hetero.workloads.normalization import (
    BandStats,
    BandStatsAccumulator,
    cached_band_stats,
    file_identity,
)

__all__ = [
    "HYPERSPECTRAL_SPLITS",
    "HyperspectralPatches",
    "HyperspectralScene",
    "SplitMethod",
    "find_scene_files",
    "hyperspectral_datasets",
    "load_hyperspectral_scene",
    "split_scene_pixels",
    "write_class_map",
]

logger = logging.getLogger(__name__)

SplitMethod = Literal["block", "random"]
HYPERSPECTRAL_SPLITS: tuple[str, ...] = ("train", "val", "test")
_SCENE_SUFFIXES = (".mat", ".tif", ".tiff")


# ================================================================================ loading


@dataclass(frozen=True)
class HyperspectralScene:
    """A loaded scene.

    Attributes:
        cube: ``(H, W, C)`` float32 image.
        labels: ``(H, W)`` int64 map, 0 = unlabelled, 1..K = classes.
        image_path: File the cube came from. label_path: File the labels came from.
        profile: rasterio profile of a GeoTIFF cube (CRS, transform), else ``None``.
    """

    cube: np.ndarray
    labels: np.ndarray
    image_path: Path
    label_path: Path
    profile: dict[str, Any] | None = None

    @property
    def num_bands(self) -> int:
        """C."""
        return int(self.cube.shape[2])

    @property
    def num_classes(self) -> int:
        """K: the largest label value."""
        return int(self.labels.max())

    @property
    def shape(self) -> tuple[int, int]:
        """(H, W)."""
        return int(self.labels.shape[0]), int(self.labels.shape[1])


def _load_mat_array(path: Path, key: str | None, ndim: int, what: str) -> np.ndarray:
    import scipy.io

    try:
        contents = scipy.io.loadmat(str(path))
    except NotImplementedError as exc:  # scipy: "Please use HDF reader for matlab v7.3 files"
        raise DataError(
            f"{path}: MATLAB v7.3 (HDF5) file, which scipy cannot read ({exc}). Fix: re-save it "
            "in MATLAB as v7 (save(..., '-v7')), or convert it to GeoTIFF."
        ) from exc
    except Exception as exc:
        raise DataError(unreadable_message(path, exc, f"{what} (.mat)")) from exc
    arrays = {k: v for k, v in contents.items() if not k.startswith("__") and isinstance(v, np.ndarray)}
    if key is not None:
        if key not in arrays:
            raise DataError(
                f"{path}: no variable {key!r}; it holds {sorted(arrays)}. Fix: set the key to "
                "one of those."
            )
        array = arrays[key]
    else:
        candidates = {k: v for k, v in arrays.items() if v.ndim == ndim}
        if len(candidates) != 1:
            raise DataError(
                f"{path}: cannot tell which variable is the {what}: {ndim}-D variables "
                f"{sorted(candidates) or 'none'} among {sorted(arrays)}. Fix: name it "
                f"explicitly ({'image_key' if ndim == 3 else 'label_key'})."
            )
        array = next(iter(candidates.values()))
    if array.ndim != ndim:
        raise DataError(f"{path}: the {what} must be {ndim}-D, got shape {array.shape}")
    return array


def _load_tif_array(path: Path, what: str) -> tuple[np.ndarray, dict[str, Any]]:
    import rasterio

    try:
        with rasterio.open(path) as src:
            array = src.read()
            profile = dict(src.profile)
    except Exception as exc:
        raise DataError(unreadable_message(path, exc, f"{what} (GeoTIFF)")) from exc
    return array, profile


def find_scene_files(root: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Find ``(image, labels)`` in ``root`` by the public scenes' naming.

    The label file is the one whose stem ends in ``_gt`` (``Indian_pines_gt.mat``,
    ``PaviaU_gt.mat``); the image is the other scene file whose stem starts with the label
    file's prefix, preferring ``<prefix>_corrected`` (``Indian_pines_corrected.mat``).

    Raises:
        DataError: No unique pair; the message lists the candidates and says to set
            ``image`` / ``labels`` explicitly.
    """
    root = Path(root)
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in _SCENE_SUFFIXES)
    gts = [p for p in files if p.stem.lower().endswith("_gt")]
    if len(gts) != 1:
        raise DataError(
            f"{root}: expected exactly one label map named '*_gt.mat' or '*_gt.tif', found "
            f"{[p.name for p in gts] or 'none'} among {[p.name for p in files] or 'no scene files'}. "
            "Fix: set data.hyperspectral.image and data.hyperspectral.labels explicitly."
        )
    gt = gts[0]
    prefix = gt.stem[: -len("_gt")].lower()
    images = [p for p in files if p != gt and p.stem.lower().startswith(prefix)]
    preferred = [p for p in images if p.stem.lower() == f"{prefix}_corrected"]
    if preferred:
        images = preferred
    if len(images) != 1:
        raise DataError(
            f"{root}: cannot tell which file is the image for {gt.name}: candidates "
            f"{[p.name for p in images] or 'none'}. Fix: set data.hyperspectral.image explicitly."
        )
    return images[0], gt


def load_hyperspectral_scene(
    image_path: str | os.PathLike[str],
    label_path: str | os.PathLike[str],
    *,
    image_key: str | None = None,
    label_key: str | None = None,
) -> HyperspectralScene:
    """Read a scene from ``.mat`` (scipy) or GeoTIFF (rasterio) files.

    ``.mat`` cubes are ``H x W x C`` (as the public files are); GeoTIFF cubes are read as
    ``C x H x W`` and transposed. Without a key, the only 3-D (image) / 2-D (labels) variable
    of a ``.mat`` file is used.

    Raises:
        DataError: Missing, corrupt, truncated or unsupported files (naming the file and the
            fix); image and labels of different height/width; labels that are not
            non-negative integers; no labelled pixel.
    """
    image_path, label_path = Path(image_path), Path(label_path)
    for path in (image_path, label_path):
        if not path.is_file():
            raise DataError(
                f"hyperspectral scene file not found: {path}. Fix: check data.root and "
                "data.hyperspectral.image / labels, or set data.generate to create a synthetic scene."
            )
    profile: dict[str, Any] | None = None
    if image_path.suffix.lower() == ".mat":
        cube = _load_mat_array(image_path, image_key, 3, "image cube")
    else:
        raw, profile = _load_tif_array(image_path, "image cube")
        cube = np.transpose(raw, (1, 2, 0))
    if label_path.suffix.lower() == ".mat":
        labels = _load_mat_array(label_path, label_key, 2, "label map")
    else:
        raw, _ = _load_tif_array(label_path, "label map")
        if raw.shape[0] != 1:
            raise DataError(f"{label_path}: a label map must have one band, it has {raw.shape[0]}")
        labels = raw[0]
    if cube.shape[:2] != labels.shape:
        raise DataError(
            f"{image_path} is {cube.shape[0]}x{cube.shape[1]} pixels but {label_path} is "
            f"{labels.shape[0]}x{labels.shape[1]}: image and labels must cover the same grid. "
            "Fix: pair the right files."
        )
    if not np.issubdtype(labels.dtype, np.integer) and (
        not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels))
    ):
        raise DataError(f"{label_path}: labels must be integers (0 = unlabelled)")
    labels = labels.astype(np.int64)
    if labels.min() < 0:
        raise DataError(f"{label_path}: labels must be >= 0 (0 = unlabelled), found {labels.min()}")
    if labels.max() == 0:
        raise DataError(f"{label_path}: no labelled pixel (every label is 0)")
    cube = np.ascontiguousarray(cube, dtype=np.float32)
    if not np.all(np.isfinite(cube)):
        raise DataError(f"{image_path}: the image holds NaN or infinite values")
    return HyperspectralScene(cube, labels, image_path, label_path, profile)


# ================================================================================ splits


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1) > 1e-6:
        raise ConfigError(
            "hyperspectral split fractions must be three non-negative numbers (train > 0, val, "
            f"test) summing to 1, got {list(fractions)}"
        )
    return fr  # type: ignore[return-value]


def _assign_blocks(
    block_hist: np.ndarray, fractions: tuple[float, float, float], rng: np.random.Generator
) -> np.ndarray:
    """Greedy class-balanced assignment of blocks to splits; returns a split id per block.

    Blocks holding the rarest classes are placed first; each block goes to the split whose
    per-class deficit (target minus assigned, relative to the class total) it fills best.
    """
    nblocks, _ = block_hist.shape
    totals = np.maximum(block_hist.sum(axis=0), 1).astype(np.float64)
    targets = np.asarray(fractions)[:, None] * totals[None, :]
    assigned = np.zeros_like(targets)
    share = block_hist / totals[None, :]
    order = np.lexsort((rng.random(nblocks), -share.max(axis=1)))
    split_of = np.zeros(nblocks, dtype=np.int64)
    labelled = block_hist.sum(axis=1) > 0
    for b in order:
        if not labelled[b]:
            split_of[b] = rng.choice(3, p=np.asarray(fractions))
            continue
        deficit = np.clip(targets - assigned, 0, None) / totals[None, :]
        score = deficit @ block_hist[b]
        score[np.asarray(fractions) == 0] = -np.inf
        split_of[b] = int(np.argmax(score))
        assigned[split_of[b]] += block_hist[b]
    return split_of


def split_scene_pixels(
    labels: np.ndarray,
    *,
    method: SplitMethod = "block",
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    block_size: int = 16,
    patch_size: int = 9,
    guard: bool = True,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Assign labelled pixels (patch centres) to train/val/test.

    Args:
        labels: ``(H, W)`` map, 0 = unlabelled.
        method: ``"block"`` (spatially disjoint blocks, the default) or ``"random"``.
        fractions: Target train/val/test fractions of the labelled pixels.
        block_size: Side of the square blocks (``"block"``).
        patch_size: k of the ``k x k`` patches (for the guard band).
        guard: ``"block"`` only: drop centres whose patch reaches into another split's
            block, so no training patch contains a single validation or test pixel.
        seed: Seed of the assignment.

    Returns:
        ``{split: (N, 2) int64 array of (row, col)}``, each in row-major order; no pixel is
        in two splits.
    """
    fr = _check_fractions(fractions)
    if method not in ("block", "random"):
        raise ConfigError(f"hyperspectral split must be 'block' or 'random', got {method!r}")
    if patch_size < 1 or patch_size % 2 == 0:
        raise ConfigError(f"patch_size must be a positive odd integer, got {patch_size}")
    labels = np.asarray(labels)
    h, w = labels.shape
    rng = np.random.default_rng([seed, 4242])
    split_id = np.full((h, w), -1, dtype=np.int64)
    if method == "random":
        for c in np.unique(labels[labels > 0]):
            flat = np.flatnonzero(labels.ravel() == c)
            flat = flat[rng.permutation(flat.size)]
            n_train = max(1, round(fr[0] * flat.size))
            n_val = round(fr[1] * flat.size)
            for s, part in enumerate((flat[:n_train], flat[n_train:n_train + n_val],
                                      flat[n_train + n_val:])):
                split_id.ravel()[part] = s
    else:
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        by, bx = np.arange(h) // block_size, np.arange(w) // block_size
        nbx = int(bx.max()) + 1
        block_of = by[:, None] * nbx + bx[None, :]
        k = int(labels.max())
        hist = np.zeros((block_of.max() + 1, k + 1), dtype=np.int64)
        np.add.at(hist, (block_of.ravel(), labels.ravel()), 1)
        split_of_block = _assign_blocks(hist[:, 1:], fr, rng)
        area = split_of_block[block_of]  # split of every pixel's block
        split_id = np.where(labels > 0, area, -1)
        if guard and patch_size > 1:
            from scipy.ndimage import minimum_filter

            for s in range(3):
                inside = minimum_filter((area == s).astype(np.uint8), size=patch_size,
                                        mode="constant", cval=1)
                split_id[(split_id == s) & (inside == 0)] = -1
    out: dict[str, np.ndarray] = {}
    for s, name in enumerate(HYPERSPECTRAL_SPLITS):
        rows, cols = np.nonzero(split_id == s)
        out[name] = np.stack([rows, cols], axis=1).astype(np.int64)
    missing = [
        int(c) for c in np.unique(labels[labels > 0])
        if not np.any(labels[out["train"][:, 0], out["train"][:, 1]] == c)
    ]
    if missing:
        logger.warning(
            "hyperspectral %s split: class(es) %s have no training pixel (too few blocks); "
            "use a smaller block_size or more training fraction", method, missing,
        )
    return out


# ================================================================================ dataset


class HyperspectralPatches:
    """Map-style dataset of ``k x k`` patches around given centres of a (normalised) scene.

    Items are ``{"image": float32 (C, k, k), "label": int64}`` with label ``class - 1``
    (``-1`` for an unlabelled centre, used when predicting a whole scene). Patches are views
    into one reflect-padded, already normalised tensor shared by all splits, so an item costs
    one slice (a few microseconds) and the collate's stack is the only copy. (A batched
    ``__getitems__`` gathering with advanced indexing measured 6x slower, so there is none.)

    Args:
        padded: ``(C, H + 2r, W + 2r)`` float32 tensor, r = k // 2.
        labels: ``(H, W)`` int64 map.
        centres: ``(N, 2)`` (row, col) array.
        patch_size: k.
    """

    def __init__(self, padded: Any, labels: np.ndarray, centres: np.ndarray, patch_size: int) -> None:
        import torch

        self.padded = padded
        self.patch_size = patch_size
        self.centres = torch.as_tensor(np.asarray(centres, dtype=np.int64).reshape(-1, 2))
        values = np.asarray(labels)[self.centres[:, 0].numpy(), self.centres[:, 1].numpy()]
        self.labels = torch.as_tensor(values.astype(np.int64) - 1)
        self.num_bands = int(padded.shape[0])
        self.num_classes = int(np.asarray(labels).max())

    def __len__(self) -> int:
        return int(self.centres.shape[0])

    def __getitem__(self, index: int) -> dict[str, Any]:
        y, x = (int(v) for v in self.centres[index])
        k = self.patch_size
        return {"image": self.padded[:, y : y + k, x : x + k], "label": self.labels[index]}


def _pad_scene(cube: np.ndarray, stats: BandStats | None, patch_size: int) -> Any:
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(cube.transpose(2, 0, 1)))
    if stats is not None:
        mean = torch.tensor(stats.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(stats.std, dtype=torch.float32).view(-1, 1, 1)
        x = (x - mean) / torch.where(std > 1e-12, std, torch.ones_like(std))
    r = patch_size // 2
    if r == 0:
        return x.contiguous()
    mode = "reflect" if min(x.shape[1:]) > r else "replicate"
    return F.pad(x[None], (r, r, r, r), mode=mode)[0].contiguous()


def hyperspectral_band_stats(
    scene: HyperspectralScene,
    train_centres: np.ndarray,
    *,
    cache_dir: str | os.PathLike[str] | None,
    split_key: dict[str, Any],
) -> BandStats:
    """Per-band mean/std over the training centre pixels (cached under ``cache_dir``)."""
    key = {
        "kind": "hyperspectral-train-centres",
        "image": file_identity(scene.image_path),
        "labels": file_identity(scene.label_path),
        "split": split_key,
    }

    def compute() -> BandStats:
        acc = BandStatsAccumulator()
        acc.update(scene.cube[train_centres[:, 0], train_centres[:, 1]], band_axis=-1)
        return acc.result()

    return cached_band_stats(key, compute, cache_dir)


def hyperspectral_datasets(
    image_path: str | os.PathLike[str],
    label_path: str | os.PathLike[str],
    *,
    splits: Sequence[str] = ("train", "val"),
    patch_size: int = 9,
    method: SplitMethod = "block",
    fractions: Sequence[float] = (0.6, 0.2, 0.2),
    block_size: int = 16,
    guard: bool = True,
    seed: int = 0,
    normalize: bool = True,
    image_key: str | None = None,
    label_key: str | None = None,
    cache_dir: str | os.PathLike[str] | None = "auto",
    include_scene: bool = False,
) -> dict[str, Any]:
    """Patch datasets of one scene, one per split (see :func:`split_scene_pixels`).

    Args:
        image_path, label_path: The scene files (``.mat`` or GeoTIFF).
        splits: Which of train/val/test to return; add ``"scene"`` to also get every pixel of
            the scene (for whole-scene prediction, labels of unlabelled pixels are -1).
        patch_size: k (odd).
        method, fractions, block_size, guard, seed: The split (the same arguments always give
            the same split).
        normalize: Standardise every band with the training pixels' mean/std (cached as JSON
            under ``cache_dir``; ``"auto"``: ``.raytrain_hetero_cache`` beside the image,
            ``None``: no cache).
        image_key, label_key: ``.mat`` variable names (default: the only 3-D / 2-D one).
        include_scene: Also return the loaded :class:`HyperspectralScene` under ``"_scene"``.

    Returns:
        ``{split: HyperspectralPatches}`` (plus ``"_scene"`` if asked).

    Raises:
        DataError: Unreadable / inconsistent files (see :func:`load_hyperspectral_scene`) or a
            split without any sample.
        ConfigError: Invalid split arguments.
    """
    wanted = (splits,) if isinstance(splits, str) else tuple(splits)
    bad = [s for s in wanted if s not in (*HYPERSPECTRAL_SPLITS, "scene")]
    if not wanted or bad:
        raise ConfigError(
            f"hyperspectral splits must be a non-empty subset of {[*HYPERSPECTRAL_SPLITS, 'scene']}, "
            f"got {list(wanted)}"
        )
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1 or patch_size % 2 == 0:
        raise ConfigError(f"patch_size must be a positive odd integer, got {patch_size!r}")
    scene = load_hyperspectral_scene(image_path, label_path, image_key=image_key, label_key=label_key)
    centres = split_scene_pixels(
        scene.labels, method=method, fractions=fractions, block_size=block_size,
        patch_size=patch_size, guard=guard, seed=seed,
    )
    split_key = {"method": method, "fractions": [float(f) for f in fractions],
                 "block_size": block_size, "patch_size": patch_size, "guard": guard, "seed": seed}
    if cache_dir == "auto":
        cache_dir = scene.image_path.parent / ".raytrain_hetero_cache"
    if len(centres["train"]) == 0:
        raise DataError(
            f"{scene.label_path}: the {method} split left no training pixel. Fix: lower "
            "block_size or patch_size, or set guard: false."
        )
    stats = (
        hyperspectral_band_stats(scene, centres["train"], cache_dir=cache_dir, split_key=split_key)
        if normalize else None
    )
    padded = _pad_scene(scene.cube, stats, patch_size)
    out: dict[str, Any] = {}
    for split in wanted:
        if split == "scene":
            rows, cols = np.indices(scene.shape)
            split_centres = np.stack([rows.ravel(), cols.ravel()], axis=1)
        else:
            split_centres = centres[split]
            if len(split_centres) == 0:
                raise DataError(
                    f"{scene.label_path}: the {method} split left no {split} pixel. Fix: lower "
                    "block_size, change the fractions, or set guard: false."
                )
        out[split] = HyperspectralPatches(padded, scene.labels, split_centres, patch_size)
    if include_scene:
        out["_scene"] = scene
    return out


def write_class_map(
    class_map: np.ndarray,
    path: str | os.PathLike[str],
    *,
    profile: dict[str, Any] | None = None,
) -> Path:
    """Write an ``(H, W)`` class map (1..K, 0 = none) as a one-band uint8/uint16 GeoTIFF.

    With the ``profile`` of a GeoTIFF scene the map keeps the scene's CRS and transform.
    """
    import rasterio
    import rasterio.errors

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = "uint8" if int(class_map.max(initial=0)) < 256 else "uint16"
    meta: dict[str, Any] = {
        "driver": "GTiff", "height": int(class_map.shape[0]), "width": int(class_map.shape[1]),
        "count": 1, "dtype": dtype,
    }
    if profile is not None:
        for key in ("crs", "transform"):
            if profile.get(key) is not None:
                meta[key] = profile[key]
    import warnings

    with warnings.catch_warnings():
        # A .mat scene has no georeference; the map is then written in pixel coordinates.
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path, "w", **meta) as dst:
            dst.write(class_map.astype(dtype)[None])
    return path


