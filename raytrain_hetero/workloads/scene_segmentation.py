"""A GeoTIFF scene and its mask raster, read by torchgeo's own ``RasterDataset``, as a
Lightning datamodule of map-style patches (what the carving sampler needs).

The data is the hyperspectral generator's ``file_format: tif`` output
(:func:`~raytrain_hetero.workloads.synthetic.hyperspectral.generate_hyperspectral_scene`:
``<name>.tif``, a C-band uint16 GeoTIFF with CRS and transform, and ``<name>_gt.tif``, the
uint8 class raster, 0 = unlabelled) or any scene in that layout. torchgeo indexes both rasters
(:class:`SceneImage` & :class:`SceneMask`); the scene is cut into a grid of
``patch_size`` squares (torchgeo's ``GridGeoSampler``), listed once, so patch ``i`` is a plain
integer index. Rows of patches are split: the last ``val_rows`` rows validate, the others train
(spatially disjoint).

:func:`predict_class_map` runs a segmentation model over the whole scene, patch by patch, and
writes the class map as a GeoTIFF with the scene's CRS and transform.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchgeo.datasets import RasterDataset, stack_samples
from torchgeo.samplers import GridGeoSampler

from raytrain_hetero.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

__all__ = [
    "SceneImage",
    "SceneMask",
    "ScenePatches",
    "SceneSegmentationDataModule",
    "predict_class_map",
    "scale_reflectance",
]

#: Digital numbers per unit reflectance in the generated scenes (and Sentinel-2 L2A).
REFLECTANCE_SCALE = 10_000.0


def scale_reflectance(sample: dict[str, Any]) -> dict[str, Any]:
    """Sample transform: uint16 digital numbers -> reflectance (about 0..1)."""
    sample["image"] = sample["image"] / REFLECTANCE_SCALE
    return sample


class SceneImage(RasterDataset):
    """The scene's image raster(s): every ``*.tif`` that is not a ``*_gt.tif`` mask."""

    filename_glob = "*.tif"
    filename_regex = r"^(?!.*_gt\.tif$).*\.tif$"
    is_image = True


class SceneMask(RasterDataset):
    """The scene's class raster(s): ``*_gt.tif`` (0 = unlabelled)."""

    filename_glob = "*_gt.tif"
    is_image = False


def _open_scene(root: Path) -> Any:
    if not root.is_dir():
        raise DataError(
            f"{root}: no scene directory. Fix: point data.root at a folder with <name>.tif and "
            "<name>_gt.tif, or set data.generate to create one."
        )
    try:
        return SceneImage(paths=str(root), transforms=scale_reflectance) & SceneMask(
            paths=str(root)
        )
    except Exception as exc:  # torchgeo raises DatasetNotFoundError and friends
        raise DataError(
            f"{root}: torchgeo cannot read a scene there ({exc}). Fix: a folder with "
            "<name>.tif (image) and <name>_gt.tif (class raster) in one CRS."
        ) from exc


class ScenePatches(Dataset):
    """Map-style view of a torchgeo GeoDataset: patch ``i`` is the ``i``-th grid cell."""

    def __init__(self, dataset: Any, cells: list[Any]) -> None:
        self.dataset = dataset
        self.cells = cells

    def __len__(self) -> int:
        return len(self.cells)

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.dataset[self.cells[index]]
        mask = sample["mask"]
        # torchgeo gives the mask a band axis; the segmentation task wants (H, W) class ids.
        return {"image": sample["image"], "mask": mask.squeeze(0) if mask.dim() == 3 else mask}


def _grid_rows(dataset: Any, patch_size: int) -> list[list[Any]]:
    """The scene's patch cells, grouped into rows (north to south)."""
    cells = list(GridGeoSampler(dataset, size=patch_size, stride=patch_size))
    rows: dict[float, list[Any]] = {}
    for cell in cells:
        rows.setdefault(-float(cell[1].start), []).append(cell)
    return [sorted(rows[key], key=lambda c: float(c[0].start)) for key in sorted(rows)]


class SceneSegmentationDataModule(pl.LightningDataModule):
    """Patches of a GeoTIFF scene + mask for torchgeo's ``SemanticSegmentationTask``.

    Args:
        root: Folder of the scene (``<name>.tif`` and ``<name>_gt.tif``).
        patch_size: Patch side in pixels (a multiple of 32 for U-Net encoders).
        val_rows: Rows of patches (from the south) that validate.
        batch_size: Per-loader batch size (on HeteroTrainer the carved loader replaces
            the training loader; validation uses it).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        root: str,
        patch_size: int = 32,
        val_rows: int = 1,
        batch_size: int = 8,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if patch_size < 8 or val_rows < 1 or batch_size < 1 or num_workers < 0:
            raise ConfigError(
                "SceneSegmentationDataModule needs patch_size >= 8, val_rows >= 1, "
                f"batch_size >= 1, num_workers >= 0; got {patch_size}, {val_rows}, "
                f"{batch_size}, {num_workers}."
            )
        self.root = Path(root)
        self.patch_size = patch_size
        self.val_rows = val_rows
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_dataset: ScenePatches | None = None
        self.val_dataset: ScenePatches | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return
        dataset = _open_scene(self.root)
        rows = _grid_rows(dataset, self.patch_size)  # sizes in pixels
        if len(rows) <= self.val_rows:
            raise DataError(
                f"{self.root}: the scene has {len(rows)} row(s) of {self.patch_size}-pixel "
                f"patches, too few for val_rows={self.val_rows} plus training. Fix: a larger "
                "scene (data.generate height/width) or a smaller patch_size."
            )
        split = len(rows) - self.val_rows
        self.train_dataset = ScenePatches(dataset, [c for row in rows[:split] for c in row])
        self.val_dataset = ScenePatches(dataset, [c for row in rows[split:] for c in row])

    def _loader(self, dataset: ScenePatches | None, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise DataError("SceneSegmentationDataModule: call setup() before the loaders.")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=stack_samples,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, shuffle=False)


def predict_class_map(
    model: torch.nn.Module,
    scene: Path,
    output: Path,
    *,
    patch_size: int,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Classify every pixel of ``scene`` (a GeoTIFF) and write a uint8 class-map GeoTIFF.

    The image is read with rasterio, scaled like training (:func:`scale_reflectance`), padded
    to whole patches and classified patch by patch; the output keeps the input's CRS and
    transform. Returns the class counts.
    """
    import rasterio

    from raytrain_hetero.workloads.hyperspectral_scene import write_class_map

    with rasterio.open(scene) as src:
        image = src.read().astype(np.float32)
        profile = src.profile
    bands, height, width = image.shape
    pad_h, pad_w = -height % patch_size, -width % patch_size
    tensor = torch.from_numpy(np.pad(image, ((0, 0), (0, pad_h), (0, pad_w)), mode="reflect"))
    tensor = scale_reflectance({"image": tensor})["image"]
    classes = np.zeros((height + pad_h, width + pad_w), dtype=np.uint8)
    model = model.to(device).eval()
    with torch.no_grad():
        for top in range(0, height + pad_h, patch_size):
            patches = [
                tensor[:, top : top + patch_size, left : left + patch_size]
                for left in range(0, width + pad_w, patch_size)
            ]
            logits = model(torch.stack(patches).to(device))
            row = logits.argmax(dim=1).cpu().numpy().astype(np.uint8)
            classes[top : top + patch_size] = np.concatenate(list(row), axis=1)
    classes = classes[:height, :width]
    write_class_map(classes, output, profile=profile)
    values, counts = np.unique(classes, return_counts=True)
    return {
        "class_map": str(output),
        "pixels": int(classes.size),
        "class_counts": {int(v): int(c) for v, c in zip(values, counts)},
        "crs": str(profile["crs"]),
        "bands": bands,
    }
