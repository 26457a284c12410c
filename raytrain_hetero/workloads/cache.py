"""Decoded samples of a small dataset: decoded once per node, shared by every worker.

``data.cache: true`` keeps a dataset's decoded samples off the training steps. Decoding every
sample in every worker (what :class:`InMemoryDataset` does) repeats the work in each worker
of each fit, restart, join and Tune trial: 1,400 EuroSAT TIFFs took 4 s in a lone worker and
71-90 s in each of eight Tune trials starting at once on two cores. :func:`node_shared_dataset`
decodes them once per node and dataset version instead: the first worker stacks every field
of the samples into one ``.npy`` array per field under the dataset's cache directory (a file
lock makes the other workers on the node wait for it rather than decode too); every worker,
then and in later fits, memory-maps the arrays, so the node's page cache holds one copy.

The arrays are keyed by a digest of everything the samples depend on (the caller's key: the
data source, the split, the left-out files, the identity of every file under the root, the
versions of the reading code); a changed file or option gives a new key and a fresh decode.
Datasets whose samples are not dicts of fixed-shape tensors/arrays/numbers, and roots whose
cache directory is not writable, fall back to :class:`InMemoryDataset` (logged).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock, Timeout
from torch.utils.data import Dataset

from raytrain_hetero.atomic import atomic_write_json, move_into_place
from raytrain_hetero.workloads.normalization import file_identity, key_digest, normalised_key

logger = logging.getLogger(__name__)

__all__ = [
    "DecodedArrays",
    "InMemoryDataset",
    "NotStackable",
    "file_identities_under",
    "node_shared_dataset",
]

#: Bumped when the on-disk layout changes: older caches are then decoded afresh.
_FORMAT = 1
#: A worker waits this long for another worker's decode before decoding into memory itself.
_LOCK_WAIT_S = 3600.0


class InMemoryDataset(Dataset):
    """Reads every item of ``dataset`` once (through the dataset's own loader) and serves copies.

    Decoding a 13-band TIFF costs about as much as a small CNN's forward pass; caching keeps
    that off every training step. Memory is the decoded size of the whole dataset in each
    worker (about 0.2 MB per 13x64x64 float32 EuroSAT image), so use it for small datasets.
    The fallback of :func:`node_shared_dataset`.

    Args:
        dataset: Map-style dataset with ``len()``.
    """

    def __init__(self, dataset: Dataset) -> None:
        started = time.perf_counter()
        # Kept so ranks can compare the source's file list (prepare_data_loader's agreement).
        self.dataset = dataset
        self.items = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]
        logger.info("cached %d items in %.1f s", len(self.items), time.perf_counter() - started)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


class NotStackable(ValueError):
    """The samples are not dicts of fixed-shape tensors/arrays/numbers (the message says why)."""


@dataclass(frozen=True)
class _Field:
    """One field of every sample: how it is stored and how it is handed back."""

    kind: str  # "tensor", "ndarray", "int", "float" or "bool"
    dtype: str  # numpy dtype name of the stored array
    shape: tuple[int, ...]  # one sample's shape

    @classmethod
    def of(cls, name: str, value: Any) -> _Field:
        if isinstance(value, torch.Tensor):
            array = value.detach().cpu().numpy()
            return cls("tensor", array.dtype.str, tuple(array.shape))
        if isinstance(value, np.ndarray) and value.dtype != object:
            return cls("ndarray", value.dtype.str, tuple(value.shape))
        for kind, types, dtype in (
            ("bool", (bool, np.bool_), "|b1"),
            ("int", (int, np.integer), "<i8"),
            ("float", (float, np.floating), "<f8"),
        ):
            if isinstance(value, types):
                return cls(kind, dtype, ())
        raise NotStackable(f"field {name!r} is a {type(value).__name__}")

    def array(self, name: str, value: Any) -> np.ndarray:
        """``value`` as this field's array; raises :class:`NotStackable` if it differs."""
        if _Field.of(name, value) != self:
            raise NotStackable(f"field {name!r} changes type, dtype or shape between samples")
        if isinstance(value, torch.Tensor):
            return value.detach().cpu().numpy()
        return np.asarray(value, dtype=self.dtype)

    def value(self, stored: np.ndarray) -> Any:
        """The sample's value from its (memory-mapped) row: a fresh, writable copy."""
        if self.kind == "tensor":
            return torch.from_numpy(np.array(stored))
        if self.kind == "ndarray":
            return np.array(stored)
        return {"int": int, "float": float, "bool": bool}[self.kind](stored)


class DecodedArrays(Dataset):
    """Samples served from per-field arrays written by :func:`node_shared_dataset`.

    Each item is a dict with the source's fields, each a fresh copy (a tensor where the source
    gave a tensor). The arrays are memory-mapped lazily, so the dataset pickles as a path and
    every process on a node shares one copy in the page cache.

    Args:
        directory: The published cache directory (``meta.json`` and one ``.npy`` per field).
        source: The dataset the arrays were decoded from (kept as ``dataset``, so ranks can
            compare the source's file list), or ``None``.
    """

    def __init__(self, directory: str | os.PathLike[str], source: Any = None) -> None:
        self.directory = Path(directory)
        self.dataset = source
        meta = json.loads((self.directory / "meta.json").read_text())
        self.size = int(meta["size"])
        self.fields = {
            name: _Field(spec["kind"], spec["dtype"], tuple(spec["shape"]))
            for name, spec in meta["fields"].items()
        }
        self._arrays: dict[str, np.ndarray] | None = None

    def _open(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {
                name: np.load(self.directory / f"{name}.npy", mmap_mode="r") for name in self.fields
            }
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.size <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} samples")
        arrays = self._open()
        return {name: field.value(arrays[name][index]) for name, field in self.fields.items()}


def file_identities_under(root: str | os.PathLike[str], *, skip: str) -> list[dict[str, Any]]:
    """:func:`file_identity` of every file under ``root`` (links followed), in path order,
    leaving out directories named ``skip`` (the cache itself)."""
    found: list[dict[str, Any]] = []
    for directory, subdirs, files in os.walk(root, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if d != skip)
        found.extend(file_identity(os.path.join(directory, name)) for name in sorted(files))
    return found


def _decode_into(dataset: Any, directory: Path) -> None:
    """Decode every sample of ``dataset`` into one ``.npy`` per field in ``directory``."""
    size = len(dataset)
    if size == 0:
        raise NotStackable("the dataset is empty")
    first = dataset[0]
    if not isinstance(first, Mapping) or not first:
        raise NotStackable(f"samples are {type(first).__name__}, not dicts of fields")
    names = [str(name) for name in first]
    for name in names:
        if not name.isidentifier():
            raise NotStackable(f"field name {name!r} is not a plain identifier")
    fields = {name: _Field.of(name, first[name]) for name in names}
    arrays = {
        name: np.lib.format.open_memmap(
            directory / f"{name}.npy", mode="w+", dtype=field.dtype, shape=(size, *field.shape)
        )
        for name, field in fields.items()
    }
    for index in range(size):
        sample = first if index == 0 else dataset[index]
        if not isinstance(sample, Mapping) or sorted(map(str, sample)) != sorted(names):
            raise NotStackable(f"sample {index} has other fields than sample 0")
        for name, field in fields.items():
            arrays[name][index] = field.array(name, sample[name])
    for array in arrays.values():
        array.flush()
    del arrays
    meta = {
        "format": _FORMAT,
        "size": size,
        "fields": {
            name: {"kind": f.kind, "dtype": f.dtype, "shape": list(f.shape)}
            for name, f in fields.items()
        },
    }
    atomic_write_json(directory / "meta.json", meta)


def _drop_older_versions(base: Path, family: str, *, keep: Path) -> None:
    """Delete the family's other decoded directories (their lock files stay: a worker may
    be waiting on one, and an unlinked lock would no longer exclude anyone)."""
    for old in base.glob(f"decoded-{family}-*"):
        if old.is_dir() and old != keep:
            shutil.rmtree(old, ignore_errors=True)
            logger.info("data.cache: dropped the superseded copy %s", old)


def _published(directory: Path, key: Mapping[str, Any]) -> bool:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        stored = json.loads((directory / "key.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == _FORMAT and stored == normalised_key(key)


def node_shared_dataset(
    dataset: Any,
    key: Mapping[str, Any],
    cache_dir: str | os.PathLike[str] | None,
    *,
    family: str = "samples",
) -> Dataset:
    """``dataset``'s samples decoded once per node under ``cache_dir`` and memory-mapped.

    Args:
        dataset: Map-style dataset whose items are dicts of fixed-shape tensors, arrays or
            numbers (the library's datasets: ``{"image": ..., "label": ...}``).
        key: Everything the samples depend on (JSON-able); its digest names the arrays'
            directory and the full key is checked when they are read.
        cache_dir: Directory of the decoded arrays (created); ``None``: no shared cache.
        family: What the arrays are versions of (e.g. one split of one source): publishing
            a new version deletes the family's older ones, so a changed file or code
            version does not leave a stale copy of the dataset behind on disk.

    Returns:
        A :class:`DecodedArrays` over the node's arrays, or an :class:`InMemoryDataset`
        when the samples cannot be stacked or ``cache_dir`` is not writable (logged).
    """
    if cache_dir is None:
        return InMemoryDataset(dataset)
    base = Path(cache_dir)
    target = base / f"decoded-{family}-{key_digest(key)}"
    if _published(target, key):  # the common case: another worker or fit decoded it
        return DecodedArrays(target, dataset)
    started = time.perf_counter()
    try:
        base.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock", timeout=_LOCK_WAIT_S):
            if _published(target, key):
                logger.info(
                    "decoded samples from %s (waited %.1f s for another worker)",
                    target,
                    time.perf_counter() - started,
                )
                return DecodedArrays(target, dataset)
            staged = base / f".{target.name}.{os.getpid()}.tmp"
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir()
            try:
                _decode_into(dataset, staged)
                atomic_write_json(staged / "key.json", normalised_key(key))
                shutil.rmtree(target, ignore_errors=True)  # a stale format or key
                move_into_place(staged, target)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            _drop_older_versions(base, family, keep=target)
    except NotStackable as exc:
        logger.info("data.cache: %s, so each worker keeps its own decoded copy", exc)
        return InMemoryDataset(dataset)
    except (OSError, Timeout) as exc:
        logger.info(
            "data.cache: no shared copy under %s (%s); each worker keeps its own", base, exc
        )
        return InMemoryDataset(dataset)
    logger.info(
        "decoded %d samples into %s in %.1f s", len(dataset), target, time.perf_counter() - started
    )
    return DecodedArrays(target, dataset)
