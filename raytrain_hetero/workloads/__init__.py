"""Remote-sensing workloads: torchgeo datasets, models, and generators of data in the real
on-disk formats (so the loaders stay torchgeo's own where torchgeo has one).

Datasets are looked up by name in :mod:`~raytrain_hetero.workloads.registry` (one module per
dataset registers its adapter); :mod:`~raytrain_hetero.workloads.data` reads a
:class:`DataSource` through it. Generators live in :mod:`raytrain_hetero.workloads.synthetic`.

* EuroSAT (Sentinel-2, 13 bands or a subset): :func:`generate_eurosat`, :func:`eurosat_datasets`.
* UC Merced (aerial RGB, 21 classes): :func:`generate_uc_merced`, :func:`uc_merced_datasets`.
* Hyperspectral scenes (Indian Pines / Pavia / Houston style, ``.mat`` or GeoTIFF):
  :func:`generate_hyperspectral_scene`, :func:`hyperspectral_datasets`,
  :func:`split_scene_pixels`.
* Sentinel-1 + Sentinel-2 pairs (So2Sat convention): :func:`generate_multimodal`,
  :func:`multimodal_datasets`.
* Models: :func:`build_model` (small_cnn, resnet18/50, cnn3d, fusion_cnn).

Every name is imported on first use, so ``import raytrain_hetero.workloads`` (and its
registry) loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Submodule of ``raytrain_hetero.workloads`` -> the public names it gives this package.
_EXPORTS: dict[str, str] = {
    "eurosat": (
        "EUROSAT_BANDS EUROSAT_CLASSES EUROSAT_MEAN EUROSAT_RGB_BANDS EUROSAT_SPLITS "
        "EUROSAT_STD eurosat_band_stats eurosat_datasets resolve_eurosat_bands"
    ),
    "file_checks": "CheckedLoader find_unreadable_files",
    "hyperspectral": (
        "HyperspectralPatches HyperspectralScene find_scene_files "
        "hyperspectral_datasets load_hyperspectral_scene split_scene_pixels "
        "write_class_map"
    ),
    "models": (
        "MODEL_NAMES SmallCNN SpectralSpatial3DCNN TwoBranchFusionCNN build_model "
        "check_input_channels expected_input_channels"
    ),
    "multimodal": "MULTIMODAL_CLASSES S1_BANDS S2_BANDS MultimodalPatches multimodal_datasets",
    "normalization": "BandStats Standardize cached_band_stats",
    "registry": (
        "DatasetAdapter DataSource WorkloadData dataset_adapter dataset_names register_dataset"
    ),
    "synthetic.eurosat": "generate_eurosat",
    "synthetic.hyperspectral": "generate_hyperspectral_scene",
    "synthetic.multimodal": "generate_multimodal",
    "synthetic.uc_merced": "generate_uc_merced",
    "uc_merced": "UCMERCED_CLASSES uc_merced_datasets",
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names.split()}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
