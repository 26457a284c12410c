"""Two-modality land cover: Sentinel-1 SAR + Sentinel-2 multispectral patches.

Samples follow torchgeo's ``So2Sat`` convention: ``{"image": cat(S1 bands, S2 bands),
"label"}``, SAR channels first, so the same two-branch model
(:class:`~raytrain_hetero.workloads.models.TwoBranchFusionCNN`) reads the real So2Sat and the
generated data.

* Real data: a So2Sat root (``training.h5`` / ``validation.h5`` / ``testing.h5``, version 2)
  is read through ``torchgeo.datasets.So2Sat``; that needs h5py (not installed here, so this
  path is untested on this machine; a missing h5py is a clear DataError).
* Generated data (:func:`generate_multimodal`), a documented GeoTIFF layout, one co-registered
  pair of patches per sample (HDF5 cannot be written here without h5py)::

      root/
        .raytrain_hetero_generated.json        marker: generator parameters (written last)
        classes.txt                            class names, label = line number (0-based)
        multimodal-train.txt                   one sample id "<Class>/<Class>_<n>" per line
        multimodal-val.txt
        multimodal-test.txt
        s1/<Class>/<Class>_<n>.tif             Sentinel-1 GRD: 2 float32 bands (VV, VH),
                                               sigma0 in dB, size x size px, 10 m UTM grid
        s2/<Class>/<Class>_<n>.tif             Sentinel-2 L2A: 10 uint16 bands, reflectance
                                               * 10000, So2Sat's band set B02 B03 B04 B05
                                               B06 B07 B08 B8A B11 B12, same grid

  The classes are Local-Climate-Zone-like land covers whose evidence is split between the
  sensors: optical spectra separate vegetation, soil, water and built-up materials, but a
  ``cloud_fraction`` of the Sentinel-2 patches are under thick cloud (and its shadow); SAR
  sees through clouds and separates built-up types by double-bounce brightness and texture,
  but not low plants from bare soil (similar roughness) under multiplicative speckle. So
  each single modality is ambiguous on a known subset of samples and fusion is not.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.eurosat import (
    _MAT,
    EUROSAT_BANDS,
    _coords,
    _dots,
    _grid,
    _rectangles,
    _smooth_noise,
    _soft,
    _stripes,
)
from raytrain_hetero.workloads.file_checks import (
    BadFilePolicy,
    apply_bad_file_policy,
    find_unreadable_files,
    unreadable_message,
)
from raytrain_hetero.workloads.generated_tree import generate_tree
from raytrain_hetero.workloads.normalization import (
    BandStats,
    BandStatsAccumulator,
    Standardize,
    cached_band_stats,
    file_identity,
)

__all__ = [
    "MULTIMODAL_CLASSES",
    "MULTIMODAL_SPLITS",
    "S1_BANDS",
    "S2_BANDS",
    "MultimodalPatches",
    "generate_multimodal",
    "multimodal_datasets",
]

logger = logging.getLogger(__name__)

#: Generated classes; label ``i`` is ``MULTIMODAL_CLASSES[i]`` (also in ``classes.txt``).
MULTIMODAL_CLASSES: tuple[str, ...] = (
    "BareSoil", "CompactUrban", "DenseTrees", "HeavyIndustry", "LowPlants", "SparselyBuilt",
    "Water",
)  # fmt: skip
MULTIMODAL_SPLITS: tuple[str, ...] = ("train", "val", "test")
S1_BANDS: tuple[str, ...] = ("VV", "VH")
S2_BANDS: tuple[str, ...] = (
    "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B11", "B12",
)  # fmt: skip
_S2_INDEX = [EUROSAT_BANDS.index(b) for b in S2_BANDS]
_SPLIT_FILE = "multimodal-{split}.txt"
_GENERATOR_VERSION = 1
_CHUNK = 128
_SO2SAT_FILES = {"train": "training.h5", "val": "validation.h5", "test": "testing.h5"}

# Mean backscatter (dB) of each class: (VV, VH). Low plants and bare soil are deliberately
# close (similar roughness); built-up classes add bright point/block scatterers below.
_SIGMA0_DB: dict[str, tuple[float, float]] = {
    "BareSoil": (-12.0, -19.5),
    "CompactUrban": (-3.0, -11.0),
    "DenseTrees": (-7.5, -13.5),
    "HeavyIndustry": (-4.0, -12.5),
    "LowPlants": (-11.5, -19.0),
    "SparselyBuilt": (-8.5, -15.0),
    "Water": (-21.0, -27.5),
}


def _optical_and_radar(cls: str, rng: np.random.Generator, n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Clean S2 (n, 10, s, s) reflectance*1e4 and S1 (n, 2, s, s) linear sigma0 of a class."""
    layers: list[tuple[str, Any]]
    bright = np.zeros((n, s, s), np.float32)  # extra SAR double-bounce (linear multiplier)
    if cls == "BareSoil":
        layers = [("soil", 1.0), ("herb", 0.4 * _soft(_smooth_noise(rng, n, s, 6.0), 1.0))]
    elif cls == "CompactUrban":
        houses, streets = _grid(rng, n, s, 4.0, 6.0, 0.7)
        layers = [("concrete", 1.0), ("roof", houses), ("asphalt", streets)]
        bright = 6.0 * houses
    elif cls == "DenseTrees":
        layers = [("shadow", 1.0), ("forest", _soft(_smooth_noise(rng, n, s, 1.5), 1.5))]
    elif cls == "HeavyIndustry":
        halls = _rectangles(rng, n, s, 4)
        layers = [("concrete", 1.0), ("roof", halls)]
        bright = 8.0 * (halls - np.roll(halls, 1, axis=2)).clip(0, 1) + 1.5 * halls
    elif cls == "LowPlants":
        layers = [("soil", 1.0), ("crop", _stripes(rng, n, s, 4.0, 8.0))]
    elif cls == "SparselyBuilt":
        houses = _dots(rng, n, s, 7.0, 10.0)
        layers = [("grass", 1.0), ("forest", 0.4 * _soft(_smooth_noise(rng, n, s, 3.0), 1.0)),
                  ("roof", houses)]
        bright = 10.0 * houses
    elif cls == "Water":
        u, _ = _coords(rng, n, s)
        shore = np.clip(u - rng.uniform(0.7, 1.0, (n, 1, 1)) * u.max(axis=(1, 2), keepdims=True), 0, 1)
        layers = [("water", 1.0), ("grass", shore.astype(np.float32))]
    else:  # pragma: no cover
        raise AssertionError(cls)
    out: np.ndarray | None = None
    for name, mask in layers:
        spec = _MAT[name][_S2_INDEX][None, :] * (
            1 + 0.06 * rng.standard_normal((n, len(S2_BANDS))).astype(np.float32))
        spec = spec[:, :, None, None]
        if out is None:
            out = np.broadcast_to(spec, (n, len(S2_BANDS), s, s)).copy()
            continue
        m = mask if isinstance(mask, float) else mask[:, None]
        out = out + m * (spec - out)
    assert out is not None
    vv, vh = _SIGMA0_DB[cls]
    base_db = np.array([vv, vh], np.float32)[None, :, None, None] + rng.normal(0, 1.0, (n, 1, 1, 1))
    texture = 1.5 * _smooth_noise(rng, n, s, 2.0)[:, None]  # dB-scale field-level texture
    sigma0 = 10 ** ((base_db + texture) / 10) * (1 + bright[:, None])
    return out.astype(np.float32), sigma0.astype(np.float32)


def _clouds(rng: np.random.Generator, s2: np.ndarray, fraction: float) -> np.ndarray:
    """Cover ``fraction`` of the patches with thick cloud (bright, spectrally flat) and a
    dark shadow; returns the cloudy-sample flags."""
    n, _, s, _ = s2.shape
    cloudy = rng.random(n) < fraction
    if not cloudy.any():
        return cloudy
    k = int(cloudy.sum())
    density = np.clip(0.85 + 0.6 * _smooth_noise(rng, k, s, 8.0), 0, 1)[:, None]
    cloud = rng.uniform(5000, 8000, size=(k, 1, 1, 1)).astype(np.float32)
    flat = cloud * np.linspace(1.0, 0.8, len(S2_BANDS), dtype=np.float32)[None, :, None, None]
    s2[cloudy] = s2[cloudy] * (1 - density) + flat * density
    return cloudy


def _noisy(s2: np.ndarray, s1: np.ndarray, rng: np.random.Generator, looks: float = 4.0):
    """S2: brightness jitter and pixel noise -> uint16; S1: gamma speckle -> dB float32."""
    n = s2.shape[0]
    s2 = s2 * rng.uniform(0.9, 1.1, (n, 1, 1, 1)) * (1 + 0.03 * rng.standard_normal(s2.shape))
    s2 = np.clip(np.rint(s2 + 15 * rng.standard_normal(s2.shape)), 1, 65535).astype(np.uint16)
    speckle = rng.gamma(looks, 1.0 / looks, size=s1.shape)
    s1_db = (10 * np.log10(np.maximum(s1 * speckle, 1e-5))).astype(np.float32)
    return s2, s1_db


def generate_multimodal(
    root: str | os.PathLike[str],
    *,
    samples_per_class: int = 100,
    seed: int = 0,
    size: int = 32,
    cloud_fraction: float = 0.4,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Path:
    """Write a synthetic Sentinel-1 + Sentinel-2 dataset in the documented layout; return it.

    Args:
        root: Target directory (cached and atomic; a foreign directory is never touched).
        samples_per_class: Co-registered patch pairs per class (>= 3).
        seed: Generator seed (deterministic output).
        size: Patch side in pixels (So2Sat: 32).
        cloud_fraction: Fraction of Sentinel-2 patches under thick cloud, in [0, 1).
        split_fractions: Train/val/test fractions per class.

    Raises:
        ConfigError: Invalid arguments.
        DataError: ``root`` is a file or a foreign non-empty directory.
    """
    for arg, value, lo in (("samples_per_class", samples_per_class, 3), ("seed", seed, 0),
                           ("size", size, 16)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
            raise ConfigError(f"generate_multimodal: {arg} must be an integer >= {lo}, got {value!r}")
    if not 0 <= cloud_fraction < 1:
        raise ConfigError(f"generate_multimodal: cloud_fraction must be in [0, 1), got {cloud_fraction}")
    fr = tuple(float(f) for f in split_fractions)
    if len(fr) != 3 or any(f <= 0 for f in fr) or abs(sum(fr) - 1) > 1e-6:
        raise ConfigError(f"generate_multimodal: split_fractions must be 3 positive fractions summing to 1, got {split_fractions!r}")
    spc = int(samples_per_class)
    n_val, n_test = max(1, round(fr[1] * spc)), max(1, round(fr[2] * spc))
    n_train = spc - n_val - n_test
    if n_train < 1:
        raise ConfigError("generate_multimodal: samples_per_class too small for three splits")
    params = {
        "generator": "raytrain_hetero.workloads.multimodal",
        "version": _GENERATOR_VERSION,
        "samples_per_class": spc, "seed": int(seed), "size": int(size),
        "cloud_fraction": float(cloud_fraction), "split_fractions": list(fr),
    }

    def write(tmp: Path) -> None:
        import rasterio
        from affine import Affine
        from rasterio.crs import CRS

        lines: dict[str, list[str]] = {s: [] for s in MULTIMODAL_SPLITS}
        crs = CRS.from_epsg(32632)
        for ci, cls in enumerate(MULTIMODAL_CLASSES):
            for modality in ("s1", "s2"):
                (tmp / modality / cls).mkdir(parents=True)
            perm = np.random.default_rng([seed, ci, 1]).permutation(spc) + 1
            for split, members in (("train", perm[:n_train]), ("val", perm[n_train:n_train + n_val]),
                                   ("test", perm[n_train + n_val:])):
                lines[split].extend(f"{cls}/{cls}_{k}" for k in sorted(members.tolist()))
            for start in range(0, spc, _CHUNK):
                n = min(_CHUNK, spc - start)
                rng = np.random.default_rng([seed, ci, 0, start // _CHUNK])
                s2, s1 = _optical_and_radar(cls, rng, n, size)
                _clouds(rng, s2, cloud_fraction)
                s2_dn, s1_db = _noisy(s2, s1, rng)
                east = rng.uniform(300_000, 700_000, size=n)
                north = rng.uniform(4_500_000, 5_900_000, size=n)
                for j in range(n):
                    k = start + j + 1
                    grid = {"driver": "GTiff", "height": size, "width": size, "crs": crs,
                            "transform": Affine(10.0, 0, float(east[j]), 0, -10.0, float(north[j]))}
                    with rasterio.open(tmp / "s1" / cls / f"{cls}_{k}.tif", "w", count=2,
                                       dtype="float32", **grid) as dst:
                        dst.write(s1_db[j])
                        dst.descriptions = S1_BANDS
                    with rasterio.open(tmp / "s2" / cls / f"{cls}_{k}.tif", "w", count=len(S2_BANDS),
                                       dtype="uint16", **grid) as dst:
                        dst.write(s2_dn[j])
                        dst.descriptions = S2_BANDS
        (tmp / "classes.txt").write_text("\n".join(MULTIMODAL_CLASSES) + "\n")
        for split, ids in lines.items():
            (tmp / _SPLIT_FILE.format(split=split)).write_text("\n".join(ids) + "\n")

    return generate_tree(root, params, write, what="generate_multimodal")


# ------------------------------------------------------------------------------ loaders


def _read_raster(path: str) -> np.ndarray:
    import rasterio

    with rasterio.open(path) as src:
        return src.read()


class MultimodalPatches:
    """Co-registered Sentinel-1 / Sentinel-2 patch pairs of one split (generated layout).

    Items are ``{"image": float32 (2 + 10, S, S), "label": int64}``: the S1 bands (VV, VH in
    dB) then the S2 bands, like torchgeo's So2Sat; ``s1_channels`` says where S1 ends.

    Args:
        root: Dataset root in the layout of :func:`generate_multimodal`.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: Sample transform (e.g. standardisation), applied last.
        exclude: Sample ids to leave out (unreadable pairs found earlier).

    Raises:
        DataError: Missing split file, classes file or patch files (naming them).
    """

    s1_channels = len(S1_BANDS)

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        transforms: Any = None,
        exclude: Sequence[str] = (),
    ) -> None:
        self.root = Path(root)
        self.split = split
        self.transforms = transforms
        classes_file = self.root / "classes.txt"
        split_file = self.root / _SPLIT_FILE.format(split=split)
        for path in (classes_file, split_file):
            if not path.is_file():
                raise DataError(
                    f"multimodal data at {self.root}: {path.name} is missing. Fix: generate the "
                    "dataset (data.generate / generate_multimodal) or point root at a So2Sat copy."
                )
        self.classes = tuple(c for c in classes_file.read_text().split("\n") if c)
        index = {c: i for i, c in enumerate(self.classes)}
        skip = set(exclude)
        self.ids: list[str] = []
        self.targets: list[int] = []
        for line in split_file.read_text().split("\n"):
            sample_id = line.strip()
            if not sample_id or sample_id in skip:
                continue
            cls = sample_id.split("/", 1)[0]
            if cls not in index:
                raise DataError(f"{split_file}: sample {sample_id!r} has unknown class {cls!r} "
                                f"(classes.txt lists {list(self.classes)})")
            self.ids.append(sample_id)
            self.targets.append(index[cls])
        missing = [p for i in self.ids[:1] + self.ids[-1:] for p in self.paths(i) if not os.path.isfile(p)]
        if missing:
            raise DataError(f"multimodal data at {self.root}: patch file(s) missing: {missing}")

    @property
    def num_classes(self) -> int:
        """Number of classes (lines of classes.txt)."""
        return len(self.classes)

    def paths(self, sample_id: str) -> tuple[str, str]:
        """The (S1, S2) files of a sample id."""
        return (str(self.root / "s1" / f"{sample_id}.tif"), str(self.root / "s2" / f"{sample_id}.tif"))

    def read_pair(self, sample_id: str) -> np.ndarray:
        """The stacked float32 (S1 + S2, S, S) array of one sample; DataError if unreadable."""
        s1_path, s2_path = self.paths(sample_id)
        arrays = []
        for path in (s1_path, s2_path):
            try:
                arrays.append(_read_raster(path))
            except Exception as exc:  # noqa: BLE001 - any decoder error: bad file
                raise DataError(unreadable_message(path, exc, "patch")) from exc
        s1, s2 = arrays
        if s1.shape[1:] != s2.shape[1:]:
            raise DataError(
                f"{s1_path} ({s1.shape[1]}x{s1.shape[2]}) and {s2_path} ({s2.shape[1]}x"
                f"{s2.shape[2]}) are not co-registered (different sizes). Fix: resample one onto "
                "the other's grid."
            )
        for path, array, bands in ((s1_path, s1, S1_BANDS), (s2_path, s2, S2_BANDS)):
            if array.shape[0] != len(bands):
                raise DataError(
                    f"band-count mismatch: {path} has {array.shape[0]} band(s), expected "
                    f"{len(bands)} ({', '.join(bands)}). Fix: regenerate or re-export the patch "
                    "with these bands, or set data.on_bad_file: skip to leave the pair out."
                )
        return np.concatenate([s1.astype(np.float32), s2.astype(np.float32)], axis=0)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        sample = {
            "image": torch.from_numpy(self.read_pair(self.ids[index])),
            "label": torch.tensor(self.targets[index], dtype=torch.int64),
        }
        return self.transforms(sample) if self.transforms is not None else sample


def _so2sat_datasets(root: Path, splits: Sequence[str], normalize: bool, cache_dir: Any) -> dict[str, Any]:
    """torchgeo So2Sat (version 2) per split, SAR bands first; needs h5py."""
    try:
        from torchgeo.datasets import So2Sat
        from torchgeo.datasets.errors import DependencyNotFoundError
    except ImportError as exc:  # pragma: no cover - torchgeo is a dependency
        raise DataError(f"torchgeo is needed for So2Sat: {exc}") from exc
    out: dict[str, Any] = {}
    try:
        for split in splits:
            name = {"train": "train", "val": "validation", "test": "test"}[split]
            ds = So2Sat(str(root), version="2", split=name, bands=So2Sat.all_band_names)
            ds.s1_channels = len(So2Sat.all_s1_band_names)
            ds.num_classes = len(So2Sat.classes)
            out[split] = ds
    except DependencyNotFoundError as exc:
        raise DataError(
            f"{root} holds So2Sat HDF5 files, which need h5py ({exc}). Fix: pip install h5py."
        ) from None
    if normalize:
        train = out.get("train") or So2Sat(str(root), version="2", split="train")
        key = {"kind": "so2sat-train", "file": file_identity(root / _SO2SAT_FILES["train"])}

        def compute() -> BandStats:
            acc = BandStatsAccumulator()
            picks = np.random.default_rng(0).permutation(len(train))[:5000]
            for i in picks:
                acc.update(train[int(i)]["image"], band_axis=0)
            return acc.result()

        stats = cached_band_stats(key, compute, cache_dir)
        for ds in out.values():
            ds.transforms = Standardize(stats)
    return out


def multimodal_datasets(
    root: str | os.PathLike[str],
    *,
    splits: Sequence[str] = ("train", "val"),
    normalize: bool = True,
    on_bad_file: BadFilePolicy = "error",
    check_files: bool = False,
    exclude: Sequence[str] = (),
    cache_dir: str | os.PathLike[str] | None = "auto",
) -> dict[str, Any]:
    """SAR + multispectral datasets over ``root``, one per split.

    ``root`` is either a So2Sat copy (``training.h5`` present: torchgeo's ``So2Sat``, needs
    h5py) or the generated layout of :func:`generate_multimodal`. Every dataset has
    ``s1_channels`` and ``num_classes`` attributes. With ``normalize=True`` every band is
    standardised with the training split's mean/std (cached JSON under ``cache_dir``;
    ``"auto"``: ``root/.raytrain_hetero_cache``). ``check_files`` decodes every pair up front
    and applies ``on_bad_file``; ``exclude`` leaves out sample ids found bad earlier.

    Raises:
        DataError: Missing/unreadable data (naming the files), or bad files under "error".
        ConfigError: Unknown split names.
    """
    split_tuple = (splits,) if isinstance(splits, str) else tuple(splits)
    bad_splits = [s for s in split_tuple if s not in MULTIMODAL_SPLITS]
    if not split_tuple or bad_splits:
        raise ConfigError(f"multimodal splits must be a non-empty subset of {list(MULTIMODAL_SPLITS)}, "
                          f"got {list(split_tuple)}")
    root_path = Path(root).expanduser().absolute()
    if not root_path.is_dir():
        raise DataError(
            f"multimodal data not found at {root_path}: the directory does not exist. Fix: set "
            "data.generate (or call generate_multimodal), or point root at a So2Sat copy."
        )
    if cache_dir == "auto":
        cache_dir = root_path / ".raytrain_hetero_cache"
    if (root_path / _SO2SAT_FILES["train"]).is_file():
        return _so2sat_datasets(root_path, split_tuple, normalize, cache_dir)

    excluded = list(exclude)
    datasets = {s: MultimodalPatches(root_path, s, exclude=excluded) for s in split_tuple}
    if check_files:
        for split, ds in datasets.items():
            by_path = {p: i for i in ds.ids for p in ds.paths(i)}

            def read(path: str, ds: MultimodalPatches = ds, by_path: dict = by_path) -> Any:
                return ds.read_pair(by_path[path])

            bad = find_unreadable_files([ds.paths(i)[0] for i in ds.ids], read)
            bad_ids = {by_path[p] for p in apply_bad_file_policy(bad, on_bad_file,
                                                                  dataset_name=f"multimodal {split}")}
            if bad_ids:
                excluded += sorted(bad_ids)
                datasets[split] = MultimodalPatches(root_path, split, exclude=excluded)
    for split, ds in datasets.items():
        if len(ds) == 0:
            raise DataError(f"multimodal data at {root_path}, split {split!r}: no readable sample")
    if normalize:
        stats = multimodal_band_stats(root_path, cache_dir=cache_dir, exclude=excluded)
        for ds in datasets.values():
            ds.transforms = Standardize(stats)
    return datasets


def multimodal_band_stats(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None,
    exclude: Sequence[str] = (),
) -> BandStats:
    """Per-band mean/std (S1 dB, S2 DN) over the training split of the generated layout."""
    train = MultimodalPatches(root, "train", exclude=exclude)
    key = {
        "kind": "multimodal-train",
        "files": [file_identity(p) for i in train.ids for p in train.paths(i)],
    }

    def compute() -> BandStats:
        acc = BandStatsAccumulator()
        for sample_id in train.ids:
            acc.update(train.read_pair(sample_id), band_axis=0)
        return acc.result()

    return cached_band_stats(key, compute, cache_dir)
