"""A generated GeoTIFF scene + class raster through torchgeo's RasterDataset as a
GeoDataModule of grid cells, and the class map predict writes (CRS and transform kept). No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import rasterio
import torch

from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.scene_segmentation import (
    SceneSegmentationDataModule,
    predict_class_map,
)
from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene

BANDS, CLASSES = 6, 3


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scene")
    return generate_hyperspectral_scene(
        root, height=96, width=64, bands=BANDS, classes=CLASSES, file_format="tif"
    )


def test_patches_tile_the_scene_rows_split_train_and_val(scene: Path):
    datamodule = SceneSegmentationDataModule(str(scene), patch_size=32, val_rows=1)
    datamodule.setup("fit")
    train_cells, val_cells = list(datamodule.train_sampler), list(datamodule.val_sampler)
    assert (len(train_cells), len(val_cells)) == (4, 2)
    sample = datamodule.train_dataset[train_cells[3]]
    assert sample["image"].shape == (BANDS, 32, 32) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (32, 32) and sample["mask"].dtype == torch.int64
    with rasterio.open(next(scene.glob("*_gt.tif"))) as src:
        truth = torch.from_numpy(src.read(1)).long()
    # Cells tile the scene from the south, west to east; the southern row validates, so
    # the last train cell is the northern row's east half.
    assert torch.equal(sample["mask"], truth[0:32, 32:64])
    assert torch.equal(datamodule.val_dataset[val_cells[0]]["mask"], truth[64:96, 0:32])
    batch = datamodule.aug(next(iter(datamodule.val_dataloader())))
    assert batch["image"].shape == (2, BANDS, 32, 32) and batch["mask"].shape == (2, 32, 32)
    assert 0.0 < float(batch["image"].mean()) < 1.0  # reflectance, not digital numbers


def test_too_small_a_scene_is_refused_naming_the_fix(scene: Path):
    datamodule = SceneSegmentationDataModule(str(scene), patch_size=32, val_rows=3)
    with pytest.raises(DataError, match="val_rows=3"):
        datamodule.setup("fit")
    with pytest.raises(DataError, match="no scene directory"):
        SceneSegmentationDataModule(str(scene / "missing")).setup("fit")


def test_class_map_keeps_the_scenes_crs_and_transform(scene: Path, tmp_path: Path):
    torch.manual_seed(0)
    model = torch.nn.Conv2d(BANDS, CLASSES + 1, 1)
    image = next(p for p in scene.glob("*.tif") if not p.stem.endswith("_gt"))
    written = predict_class_map(model, image, tmp_path / "map.tif", patch_size=32)
    with rasterio.open(image) as src, rasterio.open(tmp_path / "map.tif") as out:
        assert out.crs == src.crs and out.transform == src.transform
        assert out.shape == src.shape and out.count == 1
        classes = out.read(1)
    assert sum(written["class_counts"].values()) == classes.size == 96 * 64
    assert int(classes.max()) <= CLASSES
