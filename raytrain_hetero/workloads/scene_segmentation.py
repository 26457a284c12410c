"""A GeoTIFF scene and its mask raster as a torchgeo ``GeoDataModule`` for segmentation.

The data is the hyperspectral generator's ``file_format: tif`` output
(:func:`~raytrain_hetero.workloads.synthetic.hyperspectral.generate_hyperspectral_scene`:
``<name>.tif``, a C-band uint16 GeoTIFF with CRS and transform, and ``<name>_gt.tif``, the
uint8 class raster, 0 = unlabelled) or any scene in that layout, read by torchgeo's own
``RasterDataset`` (:class:`SceneImage` & :class:`SceneMask`). torchgeo's ``GridGeoSampler``
cuts it into ``patch_size`` squares: the last ``val_rows`` rows of patches (from the south)
validate, the others train (spatially disjoint), carved like any ``GeoDataModule``'s draws.

:func:`predict_class_map` runs a segmentation model over the whole scene, patch by patch, and
writes the class map as a GeoTIFF with the scene's CRS and transform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import shapely
import torch
from torchgeo.datamodules import GeoDataModule
from torchgeo.datasets import RasterDataset
from torchgeo.samplers import GridGeoSampler

from raytrain_hetero.errors import ConfigError, DataError

# resolve_datamodule reads this list: torchgeo's GeoDataModule imported here is not ours.
__all__ = ["SceneImage", "SceneMask", "SceneSegmentationDataModule", "predict_class_map"]

#: Digital numbers per unit reflectance in the generated scenes (and Sentinel-2 L2A).
REFLECTANCE_SCALE = 10_000.0


class SceneImage(RasterDataset):
    """The scene's image raster(s): every ``*.tif`` that is not a ``*_gt.tif`` mask."""

    filename_glob = "*.tif"
    filename_regex = r"^(?!.*_gt\.tif$).*\.tif$"
    is_image = True


class SceneMask(RasterDataset):
    """The scene's class raster(s): ``*_gt.tif`` (0 = unlabelled)."""

    filename_glob = "*_gt.tif"
    is_image = False


class SceneSegmentationDataModule(GeoDataModule):
    """Patches of a GeoTIFF scene + mask for torchgeo's ``SemanticSegmentationTask``.

    Batches are scaled from digital numbers to reflectance (``std`` = 10,000 in torchgeo's
    ``on_after_batch_transfer`` normalisation).

    Args:
        root: Folder of the scene (``<name>.tif`` and ``<name>_gt.tif``).
        patch_size: Patch side in pixels (a multiple of 32 for U-Net encoders).
        val_rows: Rows of patches (from the south) that validate.
        batch_size: Per-loader batch size (on HeteroTrainer the carved loader replaces
            the training loader; validation uses it).
        num_workers: DataLoader worker processes.
    """

    std = torch.tensor(REFLECTANCE_SCALE)

    def __init__(
        self,
        root: str,
        patch_size: int = 32,
        val_rows: int = 1,
        batch_size: int = 8,
        num_workers: int = 0,
    ) -> None:
        if patch_size < 8 or val_rows < 1 or batch_size < 1 or num_workers < 0:
            raise ConfigError(
                "SceneSegmentationDataModule needs patch_size >= 8, val_rows >= 1, "
                f"batch_size >= 1, num_workers >= 0; got {patch_size}, {val_rows}, "
                f"{batch_size}, {num_workers}."
            )
        super().__init__(SceneImage, batch_size, patch_size, num_workers=num_workers)
        self.root = Path(root)
        self.val_rows = val_rows

    def setup(self, stage: str) -> None:
        """Index the scene and split its grid of patches (every stage alike)."""
        if not self.root.is_dir():
            raise DataError(
                f"{self.root}: no scene directory. Fix: point data.root at a folder with "
                "<name>.tif and <name>_gt.tif, or set data.generate to create one."
            )
        try:
            image = SceneImage(paths=str(self.root))
            dataset = image & SceneMask(paths=str(self.root))
        except Exception as exc:  # torchgeo raises DatasetNotFoundError and friends
            raise DataError(
                f"{self.root}: torchgeo cannot read a scene there ({exc}). Fix: a folder with "
                "<name>.tif (image) and <name>_gt.tif (class raster) in one CRS."
            ) from exc
        xmin, ymin, xmax, ymax = dataset.index.total_bounds
        patch_y = self.patch_size * image.res[1]
        rows = int((ymax - ymin) // patch_y)
        if rows <= self.val_rows:
            raise DataError(
                f"{self.root}: the scene has {rows} row(s) of {self.patch_size}-pixel patches, "
                f"too few for val_rows={self.val_rows} plus training. Fix: a larger scene "
                "(data.generate height/width) or a smaller patch_size."
            )
        split_y = ymin + self.val_rows * patch_y
        self.train_dataset = self.val_dataset = dataset
        self.train_sampler, self.val_sampler = (
            GridGeoSampler(dataset, self.patch_size, roi=shapely.box(xmin, y0, xmax, y1))
            for y0, y1 in ((split_y, ymax), (ymin, split_y))
        )


def predict_class_map(
    model: torch.nn.Module,
    scene: Path,
    output: Path,
    *,
    patch_size: int,
    device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Classify every pixel of ``scene`` (a GeoTIFF) and write a uint8 class-map GeoTIFF.

    The image is read with rasterio, scaled to reflectance like training's batches, padded
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
    tensor = tensor / REFLECTANCE_SCALE  # as training's batches
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
