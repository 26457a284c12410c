"""Read a :class:`~raytrain_hetero.workloads.registry.DataSource` through its dataset's adapter.

The training job, the predictor and the loader benchmark all read data through these
functions, so they read it the same way and never dispatch on the dataset name.

Bad files are found once, on the driver, by :func:`bad_files`; the result is cached as JSON
keyed by the identities (path, size, mtime) of every file, so the Ray workers that call it
again read the list instead of decoding the dataset a second time.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raytrain_hetero.workloads.registry import (
    CACHE_DIR_NAME,
    DatasetAdapter,
    DataSource,
    WorkloadData,
    dataset_adapter,
)


def _adapter(source: DataSource, adapter: DatasetAdapter | None) -> DatasetAdapter:
    """``adapter`` if the caller looked it up already, else the source's registered one."""
    return adapter if adapter is not None else dataset_adapter(source.dataset)


def generate_dataset(source: DataSource, *, adapter: DatasetAdapter | None = None) -> Path | None:
    """Run the dataset's generator if ``source.generate`` is set (cached); return the root.
    ``adapter``: the source's adapter, if the caller holds it (looked up otherwise)."""
    if source.generate is None:
        return None
    return _adapter(source, adapter).generate(source)


def bad_files(source: DataSource, *, adapter: DatasetAdapter | None = None) -> list[str]:
    """Find unreadable files per the source's bad-file policy (cached); return what to leave out.

    For datasets whose samples are not single files (multimodal pairs) the entries are sample
    ids. Returns ``[]`` when no check applies (no policy, or a dataset without per-file
    checks such as a hyperspectral scene, whose files are checked when read).

    Raises:
        DataError: The policy is ``"error"`` and some file is unreadable; the message lists
            them.
    """
    from raytrain_hetero.workloads.file_checks import (
        CHECK_OFF,
        apply_bad_file_policy,
        find_unreadable_files,
    )
    from raytrain_hetero.workloads.normalization import cached_json, file_identity

    adapter = _adapter(source, adapter)
    policy = source.on_bad_file if source.on_bad_file is not None else adapter.default_on_bad_file
    if policy in (None, CHECK_OFF) or adapter.scan_files is None:
        return []
    scan = adapter.scan_files(source)
    if not scan.files:
        return []
    key = {
        "kind": f"bad-files-{source.dataset}",
        "checks": "decode+bands",  # what a cached result covers: rescan when checks grow
        "files": [file_identity(f) for f in scan.files],
    }

    def compute() -> list[list[str]]:
        return [list(item) for item in find_unreadable_files(scan.files, scan.read)]

    found = cached_json(key, compute, source.cache_dir, prefix="bad_files")
    bad = [tuple(item) for item in found]
    skipped = apply_bad_file_policy(bad, policy, dataset_name=f"{source.dataset} at {source.root}")
    if scan.sample_ids is None:
        return skipped
    return [scan.sample_ids[path] for path in skipped]


def open_datasets(
    source: DataSource,
    splits: Sequence[str] = ("train", "val"),
    *,
    exclude: Sequence[str] | None = None,
    adapter: DatasetAdapter | None = None,
) -> WorkloadData:
    """Open the source's splits (with its normalisation).

    Args:
        source: What to read.
        splits: Splits to open (a hyperspectral scene also accepts ``"scene"``: every pixel).
        exclude: Files (multimodal: sample ids) to leave out; ``None`` asks
            :func:`bad_files` (cached).
        adapter: The source's adapter, if the caller holds it (looked up otherwise).
    """
    adapter = _adapter(source, adapter)
    excluded = list(bad_files(source, adapter=adapter) if exclude is None else exclude)
    return adapter.open(source, tuple(splits), excluded)


def decoded_once_per_node(source: DataSource, datasets: Mapping[str, Any]) -> dict[str, Any]:
    """``datasets`` (the source's opened splits) decoded once per node and memory-mapped.

    The decoded arrays live under the source's cache directory, keyed by the source's
    options, the split, the identity (path, size, mtime) of every file under the root and of
    the reading code (this package's ``workloads`` modules and the module of a dataset the
    user registered), and the torch and torchgeo
    versions, so every worker of every fit, restart and Tune trial on a node shares one
    decode, and any change decodes afresh (see :func:`~raytrain_hetero.workloads.cache.
    node_shared_dataset`, which also says when each worker keeps its own copy instead).
    """
    import torch
    import torchgeo

    from raytrain_hetero.workloads.cache import file_identities_under, node_shared_dataset
    from raytrain_hetero.workloads.generated_tree import resolve_version
    from raytrain_hetero.workloads.normalization import file_identity, key_digest

    code = set(Path(__file__).parent.rglob("*.py"))
    opener = inspect.getsourcefile(dataset_adapter(source.dataset).open)
    if opener is not None:  # a dataset registered by the user's own module
        code.add(Path(opener))
    common = {
        "kind": "decoded-samples",
        "source": dataclasses.asdict(source),
        "files": file_identities_under(resolve_version(source.root), skip=CACHE_DIR_NAME),
        "code": [file_identity(path) for path in sorted(code)],
        "versions": {"torch": torch.__version__, "torchgeo": torchgeo.__version__},
    }
    options = key_digest({"source": common["source"]})
    return {
        split: node_shared_dataset(
            dataset,
            {**common, "split": split},
            source.cache_dir,
            family=f"{source.dataset}-{split}-{options}",  # versions differ in files/code
        )
        for split, dataset in datasets.items()
    }


def model_arguments(
    data: WorkloadData,
    model_name: str,
    *,
    width: int,
    pretrained: Any = None,
    modalities: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :func:`~raytrain_hetero.workloads.models.build_model` for ``data``."""
    kwargs: dict[str, Any] = {
        "in_channels": data.in_channels,
        "num_classes": data.num_classes,
        "width": width,
        "pretrained": pretrained,
    }
    if model_name == "fusion_cnn":
        kwargs["s1_channels"] = data.s1_channels
        kwargs["modalities"] = tuple(modalities or ("s1", "s2"))
    return kwargs
