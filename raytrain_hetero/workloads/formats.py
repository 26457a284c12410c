"""On-disk formats of the built-in datasets: class names, band order, directory layout, file names.

The one place these are defined. The dataset adapters read data in these layouts and the
generators (:mod:`raytrain_hetero.workloads.synthetic`) write them, so both import this module
and neither imports the other's internals. Imports nothing but the standard library.

EuroSAT (``torchgeo.datasets.EuroSAT``; what ``EuroSATallBands.zip`` extracts to)::

    root/eurosat-{train,val,test}.txt          one image basename per line ("Forest_17.tif")
    root/ds/images/remote_sensing/otherDatasets/sentinel_2/tif/<Class>/<Class>_<n>.tif
                                               13 uint16 bands in EUROSAT_BANDS order, UTM

UC Merced (``torchgeo.datasets.UCMerced``; ``UCMerced_LandUse.zip`` plus torchgeo's split files)::

    root/uc_merced-{train,val,test}.txt        one basename per line ("forest07.tif")
    root/UCMerced_LandUse/Images/<class>/<class>NN.tif     RGB uint8, about 256 x 256

Sentinel-1 + Sentinel-2 pairs (this package's documented layout; a So2Sat copy is read by
``torchgeo.datasets.So2Sat`` instead)::

    root/classes.txt                           class names, label = line number (0-based)
    root/multimodal-{train,val,test}.txt       one sample id "<Class>/<Class>_<n>" per line
    root/s1/<id>.tif                           2 float32 bands (VV, VH), sigma0 in dB
    root/s2/<id>.tif                           10 uint16 bands (S2_BANDS), reflectance * 10000
"""

from __future__ import annotations

import os

#: The labelled splits of every built-in dataset (torchgeo's names).
SPLITS: tuple[str, ...] = ("train", "val", "test")

# ---------------------------------------------------------------------------------- EuroSAT

#: Class names as directory names; torchgeo (ImageFolder) numbers them in sorted order, which
#: is this order: label ``i`` is ``EUROSAT_CLASSES[i]``.
EUROSAT_CLASSES: tuple[str, ...] = (
    "AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture",
    "PermanentCrop", "Residential", "River", "SeaLake",
)  # fmt: skip
#: On-disk band order of the 13-band EuroSAT GeoTIFFs (B8A is last, as in the real files).
EUROSAT_BANDS: tuple[str, ...] = (
    "B01", "B02", "B03", "B04", "B05", "B06", "B07",
    "B08", "B09", "B10", "B11", "B12", "B8A",
)  # fmt: skip
EUROSAT_RGB_BANDS: tuple[str, ...] = ("B04", "B03", "B02")
EUROSAT_IMAGE_DIR = os.path.join(
    "ds", "images", "remote_sensing", "otherDatasets", "sentinel_2", "tif"
)
EUROSAT_SPLIT_FILE = "eurosat-{split}.txt"


def eurosat_file_name(cls: str, number: int) -> str:
    """Basename of EuroSAT image ``number`` (from 1) of class ``cls``: ``Forest_17.tif``."""
    return f"{cls}_{number}.tif"


# -------------------------------------------------------------------------------- UC Merced

#: The 21 classes, as directory names; torchgeo (ImageFolder) numbers them in sorted order.
UCMERCED_CLASSES: tuple[str, ...] = (
    "agricultural", "airplane", "baseballdiamond", "beach", "buildings", "chaparral",
    "denseresidential", "forest", "freeway", "golfcourse", "harbor", "intersection",
    "mediumresidential", "mobilehomepark", "overpass", "parkinglot", "river", "runway",
    "sparseresidential", "storagetanks", "tenniscourt",
)  # fmt: skip
UCMERCED_IMAGE_DIR = os.path.join("UCMerced_LandUse", "Images")
UCMERCED_SPLIT_FILE = "uc_merced-{split}.txt"


def uc_merced_file_name(cls: str, number: int, digits: int = 2) -> str:
    """Basename of UC Merced image ``number`` (from 0) of class ``cls``: ``forest07.tif``."""
    return f"{cls}{number:0{digits}d}.tif"


# ------------------------------------------------------------------------------- multimodal

#: Generated classes; label ``i`` is ``MULTIMODAL_CLASSES[i]`` (also in ``classes.txt``).
MULTIMODAL_CLASSES: tuple[str, ...] = (
    "BareSoil", "CompactUrban", "DenseTrees", "HeavyIndustry", "LowPlants", "SparselyBuilt",
    "Water",
)  # fmt: skip
S1_BANDS: tuple[str, ...] = ("VV", "VH")
#: So2Sat's Sentinel-2 band set, in its order.
S2_BANDS: tuple[str, ...] = (
    "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B11", "B12",
)  # fmt: skip
MULTIMODAL_CLASSES_FILE = "classes.txt"
MULTIMODAL_SPLIT_FILE = "multimodal-{split}.txt"
#: Directory of each modality's patches under the root.
MULTIMODAL_MODALITIES: tuple[str, str] = ("s1", "s2")


def multimodal_sample_id(cls: str, number: int) -> str:
    """Sample id of pair ``number`` (from 1) of class ``cls``: ``Water/Water_3``."""
    return f"{cls}/{cls}_{number}"


#: So2Sat (version 2) split -> HDF5 file name, as torchgeo names them
#: (``So2Sat.filenames_by_version["2"]``).
SO2SAT_FILES: dict[str, str] = {
    "train": "training.h5",
    "validation": "validation.h5",
    "test": "testing.h5",
}

assert tuple(sorted(EUROSAT_CLASSES)) == EUROSAT_CLASSES
assert tuple(sorted(UCMERCED_CLASSES)) == UCMERCED_CLASSES
