"""Remote-sensing workloads: torchgeo datasets, models, and generators of data in the real
on-disk formats (so the loaders stay torchgeo's own)."""

from raytrain_hetero.workloads.eurosat import (
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    EUROSAT_MEAN,
    EUROSAT_RGB_BANDS,
    EUROSAT_SPLITS,
    EUROSAT_STD,
    EuroSATNormalize,
    eurosat_datasets,
    generate_eurosat,
    resolve_eurosat_bands,
)
from raytrain_hetero.workloads.models import MODEL_NAMES, SmallCNN, build_model

__all__ = [
    "EUROSAT_BANDS",
    "EUROSAT_CLASSES",
    "EUROSAT_MEAN",
    "EUROSAT_RGB_BANDS",
    "EUROSAT_SPLITS",
    "EUROSAT_STD",
    "MODEL_NAMES",
    "EuroSATNormalize",
    "SmallCNN",
    "build_model",
    "eurosat_datasets",
    "generate_eurosat",
    "resolve_eurosat_bands",
]
