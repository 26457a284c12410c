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
"""

from raytrain_hetero.workloads.eurosat import (
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    EUROSAT_MEAN,
    EUROSAT_RGB_BANDS,
    EUROSAT_SPLITS,
    EUROSAT_STD,
    eurosat_band_stats,
    eurosat_datasets,
    resolve_eurosat_bands,
)
from raytrain_hetero.workloads.file_checks import CheckedLoader, find_unreadable_files
from raytrain_hetero.workloads.hyperspectral import (
    HyperspectralPatches,
    HyperspectralScene,
    find_scene_files,
    hyperspectral_datasets,
    load_hyperspectral_scene,
    split_scene_pixels,
    write_class_map,
)
from raytrain_hetero.workloads.models import (
    MODEL_NAMES,
    SmallCNN,
    SpectralSpatial3DCNN,
    TwoBranchFusionCNN,
    build_model,
    check_input_channels,
    expected_input_channels,
)
from raytrain_hetero.workloads.multimodal import (
    MULTIMODAL_CLASSES,
    S1_BANDS,
    S2_BANDS,
    MultimodalPatches,
    multimodal_datasets,
)
from raytrain_hetero.workloads.normalization import (
    BandStats,
    Standardize,
    cached_band_stats,
)
from raytrain_hetero.workloads.registry import (
    DatasetAdapter,
    DataSource,
    WorkloadData,
    dataset_adapter,
    dataset_names,
    register_dataset,
)
from raytrain_hetero.workloads.synthetic.eurosat import generate_eurosat
from raytrain_hetero.workloads.synthetic.hyperspectral import (
    generate_hyperspectral_scene,
)
from raytrain_hetero.workloads.synthetic.multimodal import generate_multimodal
from raytrain_hetero.workloads.synthetic.uc_merced import generate_uc_merced
from raytrain_hetero.workloads.uc_merced import (
    UCMERCED_CLASSES,
    uc_merced_datasets,
)

__all__ = [
    "EUROSAT_BANDS",
    "EUROSAT_CLASSES",
    "EUROSAT_MEAN",
    "EUROSAT_RGB_BANDS",
    "EUROSAT_SPLITS",
    "EUROSAT_STD",
    "MODEL_NAMES",
    "MULTIMODAL_CLASSES",
    "S1_BANDS",
    "S2_BANDS",
    "UCMERCED_CLASSES",
    "BandStats",
    "CheckedLoader",
    "DataSource",
    "DatasetAdapter",
    "HyperspectralPatches",
    "HyperspectralScene",
    "MultimodalPatches",
    "SmallCNN",
    "SpectralSpatial3DCNN",
    "Standardize",
    "TwoBranchFusionCNN",
    "WorkloadData",
    "build_model",
    "cached_band_stats",
    "check_input_channels",
    "dataset_adapter",
    "dataset_names",
    "eurosat_band_stats",
    "eurosat_datasets",
    "expected_input_channels",
    "find_scene_files",
    "find_unreadable_files",
    "generate_eurosat",
    "generate_hyperspectral_scene",
    "generate_multimodal",
    "generate_uc_merced",
    "hyperspectral_datasets",
    "load_hyperspectral_scene",
    "multimodal_datasets",
    "register_dataset",
    "resolve_eurosat_bands",
    "split_scene_pixels",
    "uc_merced_datasets",
    "write_class_map",
]
