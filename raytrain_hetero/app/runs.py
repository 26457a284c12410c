"""Run identity and output directories of the CLI jobs: what to name a run, when to resume it,
and when an output directory may be written into (local or on any store).

Ray Train V2 restores a run by name (``RunConfig(name, storage_path)`` whose folder holds a
checkpoint snapshot), so a name is an identity: ``--run-name NAME --resume`` continues a run
on purpose, a fresh run gets a unique name, and an existing name without ``--resume`` is
refused rather than silently continued.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from raytrain_hetero.config.fields import check_name
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.storage import StorageLocation, storage_location

__all__ = [
    "RUN_SNAPSHOT_FILE",
    "RunIdentity",
    "check_output_dir",
    "resolve_run",
    "unique_run_name",
]

logger = logging.getLogger(__name__)

#: The file Ray Train V2 keeps in a run folder listing its reported checkpoints (what a
#: restore by name reads; Ray's CHECKPOINT_MANAGER_SNAPSHOT_FILENAME).
RUN_SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


@dataclass(frozen=True)
class RunIdentity:
    """The Ray Train run a job trains in: ``RunConfig.name``, its storage (the run lives in
    ``storage / name``, a local directory or any store) and whether it is being resumed.
    """

    name: str
    storage: Path | StorageLocation
    resuming: bool = False

    @property
    def storage_location(self) -> StorageLocation:
        """``storage`` as a location (a local path: the local filesystem)."""
        return storage_location(self.storage)

    @property
    def location(self) -> StorageLocation:
        """The run's folder on its store (checkpoints and Ray Train's snapshot)."""
        return self.storage_location.join(self.name)

    @property
    def folder(self) -> Path | StorageLocation:
        """The run's folder: a local path, or its location on a remote store."""
        location = self.location
        return location if location.remote else location.local_path


def unique_run_name(prefix: str) -> str:
    """``<prefix>-<YYYYmmdd-HHMMSS>-<6 hex digits>``: two runs started in the same second on
    the same storage never share a name (and so never restore each other's checkpoints)."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def resolve_run(
    prefix: str, storage: Path | StorageLocation, run_name: str | None, resume: bool
) -> RunIdentity:
    """The run to train in (``run_name``, else a unique ``<prefix>-...`` name), checked
    against what ``storage`` already holds.

    Raises:
        ConfigError: ``--resume`` without ``--run-name``; an invalid name; a run of that name
            exists but ``--resume`` is not given; ``--resume`` names a run that does not exist.
    """
    if run_name is None:
        if resume:
            raise ConfigError(
                "--resume: which run? Fix: give the run's name, --run-name NAME --resume."
            )
        return RunIdentity(unique_run_name(prefix), storage)
    try:
        check_name(run_name, "run name")
    except ValueError as exc:
        raise ConfigError(
            f"--run-name {run_name!r} is not a valid name. Fix: use only letters, digits, "
            "'_', '.' and '-'."
        ) from exc
    identity = RunIdentity(run_name, storage, resuming=resume)
    folder = identity.location
    exists = folder.exists()
    if exists and not resume:
        raise ConfigError(
            f"--run-name {run_name}: a run of that name already exists at {folder}. "
            "Fix: add --resume to continue it from its last checkpoint, or choose another "
            "--run-name."
        )
    if resume and not exists:
        raise ConfigError(
            f"--resume: there is no run {run_name!r} in {storage}. Fix: check --run-name and "
            "the storage (ray.storage_path, else <output>/ray_results), or drop --resume to "
            "start it."
        )
    if resume and not folder.join(RUN_SNAPSHOT_FILE).exists():
        logger.warning(
            "run %s reported no checkpoint before it stopped; it starts from step 0", run_name
        )
    return identity


def check_output_dir(out: Path | StorageLocation, *, overwrite: bool, resume: bool) -> None:
    """Refuse to write into a non-empty output directory that is not this run's own (a
    resumed run writes into its own again; ``overwrite`` replaces the files the job writes).

    Raises:
        ConfigError: ``out`` is a file, or a non-empty directory without either flag.
    """
    location = storage_location(out)
    if location.is_file():
        raise ConfigError(f"output {out} is a file. Fix: give a directory as --output.")
    if overwrite or resume:
        return
    entries = location.list_names()
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(
            f"output directory {out} is not empty ({shown}). Fix: choose a new --output "
            "(or output_dir), pass --overwrite to replace the files this job writes there, "
            "or --run-name NAME --resume to continue the run that wrote it."
        )
