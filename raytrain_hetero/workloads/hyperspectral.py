"""Hyperspectral scene patch classification (Indian Pines / Pavia University / Houston style).

A *scene* is one image cube ``H x W x C`` plus a label map ``H x W`` (``0`` = unlabelled,
``1..K`` = classes). Each labelled pixel is one sample: the ``k x k x C`` patch around it
(reflect-padded at the border), labelled ``label - 1``. Files (``.mat`` as the public scenes
ship, or GeoTIFF, whose georeference the class map keeps):
:mod:`~raytrain_hetero.workloads.hyperspectral_scene`.

Splits (:func:`split_scene_pixels`): ``"block"`` (the default) gives whole ``block_size``
squares to train/val/test (greedily balanced per class) and, with ``guard=True``, keeps a
centre only if its whole patch lies in blocks of its own split. That is the *honest* split:
with random pixels a test pixel's neighbours, whose patches contain it, are in the training
set, so test accuracy measures interpolation and is strongly inflated (Liang et al., IEEE TGRS
2017; Hänsch et al. 2017). ``"random"`` (stratified pixels) is there to compare with published
numbers. No pixel is the centre of a sample in two splits; band statistics come from the
training centres only (cached, :mod:`~raytrain_hetero.workloads.normalization`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.formats import SPLITS
from raytrain_hetero.workloads.hyperspectral_scene import (
    HyperspectralScene,
    find_scene_files,
    load_hyperspectral_scene,
    write_class_map,
)
from raytrain_hetero.workloads.normalization import (
    BandStats,
    cached_band_stats,
    file_identity,
)
from raytrain_hetero.workloads.registry import (
    CACHE_DIR_NAME,
    DatasetAdapter,
    DataSource,
    SceneOptions,
    WorkloadData,
    check_splits,
    register_dataset,
    run_generator,
)
from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene

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
HYPERSPECTRAL_SPLITS: tuple[str, ...] = SPLITS


# ================================================================================ splits


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(f < 0 for f in fr) or fr[0] <= 0 or abs(sum(fr) - 1) > 1e-6:
        raise ConfigError(
            "hyperspectral split fractions must be three non-negative numbers (train > 0, val, "
            f"test) summing to 1, got {list(fractions)}"
        )
    return fr  # type: ignore[return-value]


def _check_patch_size(patch_size: Any) -> None:
    odd = isinstance(patch_size, int) and not isinstance(patch_size, bool) and patch_size % 2 == 1
    if not odd or patch_size < 1:
        raise ConfigError(f"patch_size must be a positive odd integer, got {patch_size!r}")


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
    _check_patch_size(patch_size)
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
            for s, part in enumerate(
                (flat[:n_train], flat[n_train : n_train + n_val], flat[n_train + n_val :])
            ):
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
                inside = minimum_filter(
                    (area == s).astype(np.uint8), size=patch_size, mode="constant", cval=1
                )
                split_id[(split_id == s) & (inside == 0)] = -1
    out: dict[str, np.ndarray] = {}
    for s, name in enumerate(HYPERSPECTRAL_SPLITS):
        rows, cols = np.nonzero(split_id == s)
        out[name] = np.stack([rows, cols], axis=1).astype(np.int64)
    missing = [
        int(c)
        for c in np.unique(labels[labels > 0])
        if not np.any(labels[out["train"][:, 0], out["train"][:, 1]] == c)
    ]
    if missing:
        logger.warning(
            "hyperspectral %s split: class(es) %s have no training pixel (too few blocks); "
            "use a smaller block_size or more training fraction",
            method,
            missing,
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

    def __init__(
        self, padded: Any, labels: np.ndarray, centres: np.ndarray, patch_size: int
    ) -> None:
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
    wanted = check_splits("hyperspectral", splits, (*HYPERSPECTRAL_SPLITS, "scene"))
    _check_patch_size(patch_size)
    scene = load_hyperspectral_scene(
        image_path, label_path, image_key=image_key, label_key=label_key
    )
    centres = split_scene_pixels(
        scene.labels,
        method=method,
        fractions=fractions,
        block_size=block_size,
        patch_size=patch_size,
        guard=guard,
        seed=seed,
    )
    if len(centres["train"]) == 0:
        raise DataError(
            f"{scene.label_path}: the {method} split left no training pixel. Fix: lower "
            "block_size or patch_size, or set guard: false."
        )
    stats = None
    if normalize:  # statistics of the training centre pixels, cached
        key = {
            "kind": "hyperspectral-train-centres",
            "image": file_identity(scene.image_path),
            "labels": file_identity(scene.label_path),
            "split": {
                "method": method,
                "fractions": [float(f) for f in fractions],
                "block_size": block_size,
                "patch_size": patch_size,
                "guard": guard,
                "seed": seed,
            },
        }
        if cache_dir == "auto":
            cache_dir = scene.image_path.parent / CACHE_DIR_NAME
        train = scene.cube[centres["train"][:, 0], centres["train"][:, 1]]
        stats = cached_band_stats(key, [train], cache_dir, band_axis=-1)
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


# ------------------------------------------------------------------------------ adapter


def scene_files(source: DataSource) -> tuple[Path, Path]:
    """The (image, labels) files a source names, or the ones found in its root."""
    root = Path(source.root)
    options = source.scene or SceneOptions()
    if options.image is not None and options.labels is not None:
        return root / options.image, root / options.labels
    if not root.is_dir():
        raise DataError(
            f"hyperspectral scene directory {root} does not exist. Fix: set "
            "data.root, or data.generate to create a synthetic scene"
        )
    image, labels = find_scene_files(root)
    if options.image is not None:
        image = root / options.image
    if options.labels is not None:
        labels = root / options.labels
    return image, labels


def _open(source: DataSource, splits: tuple[str, ...], exclude: list[str]) -> WorkloadData:
    options = source.scene or SceneOptions()
    image, labels = scene_files(source)
    out = hyperspectral_datasets(
        image,
        labels,
        splits=splits,
        patch_size=options.patch_size,
        method=options.split,
        fractions=options.fractions,
        block_size=options.block_size,
        guard=options.guard,
        image_key=options.image_key,
        label_key=options.label_key,
        cache_dir=source.cache_dir,
        include_scene=True,
    )
    scene = out.pop("_scene")
    names = tuple(f"class_{k}" for k in range(1, scene.num_classes + 1))
    return WorkloadData(out, scene.num_classes, scene.num_bands, class_names=names, scene=scene)


#: One hyperspectral scene in the registry; its files are checked when read (no skipping).
HYPERSPECTRAL = register_dataset(
    DatasetAdapter(
        name="hyperspectral",
        title="hyperspectral scene",
        generate=partial(run_generator, generate_hyperspectral_scene, spectral_bands="bands"),
        open=_open,
        splits=HYPERSPECTRAL_SPLITS,
        whole_scene=True,
        generate_keys=("seed", "height", "width", "spectral_bands", "classes", "file_format"),
        default_on_bad_file=None,
        source_keys=("scene",),
    )
)
