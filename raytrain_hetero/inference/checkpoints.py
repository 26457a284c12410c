"""Trainer checkpoints for prediction: find one, load it, check it fits the model and data.

Every check runs on the driver before any actor starts, so a wrong checkpoint stops with a
message naming the file, the mismatch and the fix. A checkpoint may sit on a remote store
(:class:`~raytrain_hetero.storage.StorageLocation`, e.g. a run folder in ``s3://``): it is
found by listing the store and read through its filesystem, by the driver and every actor.
"""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any

from raytrain_hetero.errors import DataError
from raytrain_hetero.storage import StorageLocation

#: A checkpoint given as a local path or as a location on any store.
CheckpointSource = str | os.PathLike[str] | StorageLocation

__all__ = [
    "CHECKPOINT_FILE",
    "check_meta_fits",
    "check_state_fits",
    "find_checkpoint_file",
    "load_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "model.pt"


def find_checkpoint_file(
    path: CheckpointSource, name: str = CHECKPOINT_FILE
) -> Path | StorageLocation:
    """Resolve ``path`` to a checkpoint file ``name`` (``model.pt``; a Lightning job's
    ``checkpoint.ckpt``): the file itself, a checkpoint directory holding one, or a run/output
    directory (the newest ``checkpoint_*/<name>`` below it).

    Returns:
        A local path, or for a remote location the location of the file.

    Raises:
        DataError: Nothing usable at ``path`` (the message says what was looked for).
    """
    if isinstance(path, StorageLocation) and not path.remote:
        path = path.local_path
    below: list[tuple[float, Any]]
    if isinstance(path, StorageLocation):
        for candidate in (path, path.join(name)):
            if candidate.is_file():
                return candidate
        below = [
            (mtime, path.join(relative))
            for relative, mtime in path.find_files(f"/{name}")
            if relative.rsplit("/", 2)[-2].startswith("checkpoint_")
        ]
    else:
        path = Path(path).expanduser()
        for local in (path, path / name):
            if local.is_file():
                return local
        found = path.rglob(f"checkpoint_*/{name}") if path.is_dir() else []
        below = [(f.stat().st_mtime, f) for f in found]
    if below:
        # Ray Train's checkpoint_<timestamp> names sort by time where mtimes tie.
        newest = max(below, key=lambda item: (item[0], str(item[1])))[1]
        logger.info("using the newest checkpoint under %s: %s", path, newest)
        return newest
    raise DataError(
        f"no checkpoint at {path}: expected a {name} file, a checkpoint directory holding one, "
        f"or a training output or run directory with checkpoint_*/{name}. Fix: pass "
        "--checkpoint pointing at one (raytrain-hetero train writes them under "
        "<output>/ray_results/; a remote run folder is <ray.storage_path>/<run name>: check "
        "ray.storage_filesystem and the credentials in the environment)."
    )


def load_checkpoint(path: CheckpointSource) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state_dict, meta)`` of a checkpoint; ``meta`` is the ``"meta"`` entry the training
    job writes (dataset, in_channels, num_classes, s1_channels), or ``{}``.

    Raises:
        DataError: Unreadable or foreign file (naming it).
    """
    import torch

    file = find_checkpoint_file(path)
    try:
        source: Any = io.BytesIO(file.read_bytes()) if isinstance(file, StorageLocation) else file
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated, or not a torch file
        raise DataError(
            f"{file}: cannot load the checkpoint ({type(exc).__name__}: {exc}). "
            "Fix: point --checkpoint at a model.pt written by raytrain-hetero train."
        ) from exc
    meta: dict[str, Any] = {}
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        meta = dict(state.get("meta") or {})
        state = state["model"]
    if not isinstance(state, dict) or not all(hasattr(v, "shape") for v in state.values()):
        raise DataError(f"{file}: not a model checkpoint (expected {{'model': state_dict}})")
    return state, meta


def check_meta_fits(meta: dict[str, Any], *, checkpoint: str, data: Any) -> None:
    """Raise a DataError if the checkpoint's recorded data shape differs from ``data``'s
    (catches band changes that leave parameter shapes alone, e.g. the 3-D CNN's bands)."""
    bands = meta.get("in_channels")
    if bands is not None and int(bands) != data.in_channels:
        raise DataError(
            f"band-count mismatch: {checkpoint} was trained on {bands} band(s) per sample but the "
            f"data has {data.in_channels}. Fix: predict on data with the bands the model was "
            "trained on (data.bands / dataset / scene), or retrain."
        )
    classes = meta.get("num_classes")
    if classes is not None and int(classes) != data.num_classes:
        raise DataError(
            f"{checkpoint} was trained for {classes} classes but the data has {data.num_classes}. "
            "Fix: use the dataset the model was trained on."
        )


def check_state_fits(
    model: Any, state: dict[str, Any], *, checkpoint: str, data_bands: int
) -> None:
    """Raise a DataError naming the mismatch if ``state`` cannot load into ``model``.

    A different first-layer input width is reported as a band-count mismatch (the
    checkpoint was trained on other bands than the data has)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [
        (k, tuple(state[k].shape), tuple(own[k].shape))
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if wrong:
        key, theirs, ours = wrong[0]
        if (
            len(theirs) >= 2
            and len(ours) >= 2
            and theirs[0] == ours[0]
            and theirs[1] != ours[1]
            and key == next(k for k, v in own.items() if getattr(v, "ndim", 0) >= 2)
        ):
            raise DataError(
                f"band-count mismatch: {checkpoint} was trained on {theirs[1]} input band(s) "
                f"(layer {key} {theirs}) but the data has {data_bands}. Fix: predict on data "
                "with the bands the model was trained on (data.bands / dataset), or retrain."
            )
        raise DataError(
            f"{checkpoint} does not fit the configured model: {key} is {theirs} in the "
            f"checkpoint but {ours} in the model ({len(wrong)} such layer(s)). Fix: use the "
            "config the checkpoint was trained with (model.name, model.width, classes)."
        )
    if missing or unexpected:
        raise DataError(
            f"{checkpoint} does not fit the configured model: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}. Fix: use the config the checkpoint was trained with."
        )
