"""Hyperspectral scene files: read a cube and its label map (``.mat`` or GeoTIFF), write a
predicted class map.

MATLAB ``.mat`` v5/v7 files are read with ``scipy.io.loadmat`` (v7.3 files are HDF5 and need
h5py); GeoTIFFs with rasterio, keeping their georeference for the class map. What a scene
*is* and how it is cut into samples: :mod:`raytrain_hetero.workloads.hyperspectral`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.atomic import atomic_write_bytes
from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.file_checks import unreadable_message

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
    except Exception as exc:  # any parser error: corrupt or truncated file
        raise DataError(unreadable_message(path, exc, f"{what} (.mat)")) from exc
    arrays = {
        k: v for k, v in contents.items() if not k.startswith("__") and isinstance(v, np.ndarray)
    }
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


def read_geotiff(path: str | os.PathLike[str], what: str) -> tuple[np.ndarray, dict[str, Any]]:
    """The ``(bands, H, W)`` array and rasterio profile of a GeoTIFF; DataError if unreadable."""
    import rasterio

    try:
        with rasterio.open(path) as src:
            array = src.read()
            profile = dict(src.profile)
    except Exception as exc:  # rasterio raises RasterioIOError and others
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
        raw, profile = read_geotiff(image_path, "image cube")
        cube = np.transpose(raw, (1, 2, 0))
    if label_path.suffix.lower() == ".mat":
        labels = _load_mat_array(label_path, label_key, 2, "label map")
    else:
        raw, _ = read_geotiff(label_path, "label map")
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


def write_class_map(
    class_map: np.ndarray,
    path: str | os.PathLike[str],
    *,
    profile: dict[str, Any] | None = None,
) -> Path:
    """Write an ``(H, W)`` class map (1..K, 0 = none) as a one-band uint8/uint16 GeoTIFF,
    atomically.

    With the ``profile`` of a GeoTIFF scene the map keeps the scene's CRS and transform.
    """
    import rasterio
    import rasterio.errors

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = "uint8" if int(class_map.max(initial=0)) < 256 else "uint16"
    meta: dict[str, Any] = {
        "driver": "GTiff",
        "height": int(class_map.shape[0]),
        "width": int(class_map.shape[1]),
        "count": 1,
        "dtype": dtype,
    }
    if profile is not None:
        for key in ("crs", "transform"):
            if profile.get(key) is not None:
                meta[key] = profile[key]
    import warnings

    from rasterio.io import MemoryFile

    with warnings.catch_warnings():
        # A .mat scene has no georeference; the map is then written in pixel coordinates.
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with MemoryFile() as memory:
            with memory.open(**meta) as dst:
                dst.write(class_map.astype(dtype)[None])
            encoded = memory.read()
    # Rendered in memory, then published atomically: a reader never sees half a GeoTIFF.
    return atomic_write_bytes(path, encoded)
