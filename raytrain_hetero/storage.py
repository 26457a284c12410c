"""The one storage mechanism: where runs, checkpoints and outputs live, local or in the cloud.

A location is a local path or a URI :func:`pyarrow.fs.FileSystem.from_uri` understands
(``s3://``, ``gs://``, ``abfs://``, ``hdfs://``); :class:`StorageLocation` holds the pyarrow
filesystem and the path on it, pickled to every node and Ray worker with the location, so all
reach the same store. :class:`StorageFilesystem` (``ray.storage_filesystem:``) sets what a URI
cannot say well (endpoint, region, scheme). Credentials never come from a config: pyarrow reads
them from the environment or the instance role, and a key or URI carrying a secret is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import field_validator, model_validator

from raytrain_hetero.atomic import atomic_write_json
from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import invalid
from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow.fs

__all__ = [
    "CostModelStore",
    "RememberedCost",
    "StagingDir",
    "StorageFilesystem",
    "StorageLocation",
    "check_no_credentials",
    "is_uri",
    "storage_location",
]

logger = logging.getLogger(__name__)

#: Key names (in a config or a URI's query) that carry a secret: refused, never used.
_SECRET_KEY = re.compile(
    r"secret|password|passwd|token|credential|access_?key|account_?key|key_?id|sas|private",
    re.IGNORECASE,
)

_CREDENTIALS_FIX = (
    "remove it and give credentials through the environment (AWS_ACCESS_KEY_ID / "
    "AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or AWS_PROFILE for S3, "
    "GOOGLE_APPLICATION_CREDENTIALS for GCS, AZURE_STORAGE_* for Azure) or an instance role "
    "/ workload identity (see deploy/aws and deploy/kuberay)"
)

#: URI schemes whose filesystem :class:`StorageFilesystem` can configure.
_CONFIGURABLE_SCHEMES = ("s3", "gs", "gcs")


def is_uri(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a URI (``scheme://...``) rather than a local path.

    ``file://`` URIs count as URIs (pyarrow resolves them to the local filesystem)."""
    return (
        isinstance(location, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location) is not None
    )


class StorageFilesystem(HeteroModel):
    """How to reach an object store (``ray.storage_filesystem:``), for every ``s3://`` /
    ``gs://`` location of a job; credentials come from the environment or the instance role, a
    key that looks like a secret is refused.

    Attributes:
        endpoint_override: Host[:port] or URL of an S3/GCS-compatible server (MinIO, Ceph);
            ``None``: the provider's own endpoint.
        region: S3 region (GCS: the location of new buckets); ``None``: pyarrow's default
            (without a spec, an ``s3://`` URI looks up its bucket's region itself).
        scheme: Connection scheme to the endpoint, ``https`` (default) or ``http``.
    """

    endpoint_override: str | None = None
    region: str | None = None
    scheme: Literal["https", "http"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, dict):
            secret = sorted(str(k) for k in data if _SECRET_KEY.search(str(k)))
            if secret:
                raise invalid(
                    f"{', '.join(secret)}: credentials are never read from a config file",
                    _CREDENTIALS_FIX,
                )
        return data

    @field_validator("endpoint_override")
    @classmethod
    def _endpoint_has_no_userinfo(cls, value: str | None) -> str | None:
        if value is not None and "@" in value:
            raise invalid("the endpoint carries credentials (user:secret@)", _CREDENTIALS_FIX)
        if value is not None and not value.strip():
            raise invalid("endpoint_override is empty", "remove it or give host:port or a URL")
        return value

    def build(self, scheme: str) -> pyarrow.fs.FileSystem:
        """The pyarrow filesystem for URIs of ``scheme`` (``s3``, ``gs``/``gcs``).

        Raises:
            ConfigError: ``scheme`` is not one this spec can configure.
        """
        import pyarrow.fs as pafs

        if scheme == "s3":
            return pafs.S3FileSystem(
                endpoint_override=self.endpoint_override,
                region=self.region,
                scheme=self.scheme or "https",
            )
        if scheme in ("gs", "gcs"):
            options: dict[str, Any] = {"scheme": self.scheme or "https"}
            if self.endpoint_override is not None:
                options["endpoint_override"] = self.endpoint_override
            if self.region is not None:
                options["default_bucket_location"] = self.region
            return pafs.GcsFileSystem(**options)
        raise ConfigError(
            f"ray.storage_filesystem configures s3:// and gs:// locations, not {scheme}://. "
            "Fix: put the filesystem's options in the URI itself (pyarrow's "
            "FileSystem.from_uri syntax), or remove ray.storage_filesystem."
        )


@dataclass(frozen=True)
class StorageLocation:
    """A place on a filesystem: a local directory or a prefix in an object store.

    Attributes:
        uri: What to show the user: the absolute local path, or ``scheme://bucket/prefix``.
        filesystem: The pyarrow filesystem (picklable: Ray workers get it with the location).
        path: The path on ``filesystem`` (``bucket/prefix`` for object stores).
        remote: Whether this is not the local filesystem.
    """

    uri: str
    filesystem: pyarrow.fs.FileSystem
    path: str
    remote: bool

    def __str__(self) -> str:
        return self.uri

    @property
    def local_path(self) -> Path:
        """The local path of a local location.

        Raises:
            ConfigError: The location is remote.
        """
        if self.remote:
            raise ConfigError(f"{self.uri} is not a local path")
        return Path(self.path)

    @property
    def name(self) -> str:
        """The last component of the path."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def join(self, *parts: str) -> StorageLocation:
        """The location ``parts`` below this one."""
        tail = "/".join(p.strip("/") for p in parts if p)
        return StorageLocation(
            uri=f"{self.uri.rstrip('/')}/{tail}",
            filesystem=self.filesystem,
            path=f"{self.path.rstrip('/')}/{tail}",
            remote=self.remote,
        )

    def cost_models(self) -> CostModelStore:
        """The store of cost models remembered by the runs kept here (workers reach it
        through the location they are handed, not by importing this module)."""
        return CostModelStore(self)

    def run_config_storage(self) -> dict[str, Any]:
        """``storage_path`` / ``storage_filesystem`` keywords of a Ray ``RunConfig``.

        A local location is passed as before (a plain path, Ray picks the filesystem)."""
        if not self.remote:
            return {"storage_path": self.path}
        return {"storage_path": self.path, "storage_filesystem": self.filesystem}

    # ------------------------------------------------------------------ queries

    def _type(self, path: str | None = None) -> Any:
        return self.filesystem.get_file_info(path or self.path).type

    def exists(self) -> bool:
        """Whether a file or directory (an object or a prefix) is there."""
        import pyarrow.fs as pafs

        return bool(self._type() != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        """Whether a file (an object) is there."""
        import pyarrow.fs as pafs

        return bool(self._type() == pafs.FileType.File)

    def list_names(self) -> list[str]:
        """Names of the entries directly below (empty if nothing is there), sorted."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        return sorted(info.base_name for info in self.filesystem.get_file_info(selector))

    def find_files(self, suffix: str) -> list[tuple[str, float]]:
        """Paths (relative to here) of the files below whose path ends with ``suffix``,
        with their modification times (0.0 where the store gives none)."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=True)
        base = self.path.rstrip("/") + "/"
        found = []
        for info in self.filesystem.get_file_info(selector):
            if info.type == pafs.FileType.File and info.path.endswith(suffix):
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                found.append((info.path.removeprefix(base), mtime))
        return found

    def read_bytes(self) -> bytes:
        """The content of the file here."""
        with self.filesystem.open_input_stream(self.path) as stream:
            return bytes(stream.read())

    # ------------------------------------------------------------------ transfers

    def download(self, local: str | os.PathLike[str]) -> Path:
        """Copy the file or directory here to ``local`` (a directory is copied into it).

        Returns:
            ``local``.
        """
        import pyarrow.fs as pafs

        target = Path(local)
        if self.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read_bytes())
            return target
        target.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(
            self.path,
            str(target),
            source_filesystem=self.filesystem,
            destination_filesystem=pafs.LocalFileSystem(),
        )
        return target

    def upload(self, local: str | os.PathLike[str]) -> None:
        """Copy the local file or directory ``local`` here (a directory's contents go below
        this location; existing objects of the same names are replaced, nothing is deleted).

        Each object store write is whole-object (a reader sees the old object or the new
        one); a local destination is written through the same copy.
        """
        import pyarrow.fs as pafs

        source = Path(local)
        if source.is_dir():
            self.filesystem.create_dir(self.path, recursive=True)
        pafs.copy_files(
            str(source),
            self.path,
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=self.filesystem,
        )


def storage_location(
    location: str | os.PathLike[str] | StorageLocation,
    filesystem: StorageFilesystem | None = None,
) -> StorageLocation:
    """Parse a local path (``~`` expanded, made absolute) or a URI pyarrow supports into a
    :class:`StorageLocation` (a location stays as is); ``filesystem`` configures ``s3://`` and
    ``gs://`` URIs.

    Raises:
        ConfigError: A URI pyarrow cannot open, or one that carries credentials.
    """
    import pyarrow as pa
    import pyarrow.fs as pafs

    if isinstance(location, StorageLocation):
        return location
    if not is_uri(location):
        path = Path(location).expanduser().absolute()
        return StorageLocation(str(path), pafs.LocalFileSystem(), str(path), remote=False)
    uri = str(location).rstrip("/")
    check_no_credentials(uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    try:
        if filesystem is not None and scheme in _CONFIGURABLE_SCHEMES:
            if parts.query:
                raise ConfigError(
                    f"storage URI {uri} has options (?{parts.query}) and ray.storage_filesystem "
                    "is set too. Fix: give the options in one place, ray.storage_filesystem."
                )
            fs = filesystem.build(scheme)
            path = f"{parts.netloc}{parts.path}".rstrip("/")
        else:
            if filesystem is not None:
                filesystem.build(scheme)  # raises: the spec cannot apply to this scheme
            fs, path = pafs.FileSystem.from_uri(uri)
    except ConfigError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(
            f"storage URI {uri}: pyarrow cannot open it ({exc}). Fix: use a local path or a "
            "URI pyarrow.fs.FileSystem.from_uri supports (s3://bucket/prefix, gs://..., "
            "abfs://container@account.dfs.core.windows.net/...)."
        ) from exc
    remote = not isinstance(fs, pafs.LocalFileSystem)
    shown = f"{scheme}://{parts.netloc}{parts.path}".rstrip("/") if remote else path
    return StorageLocation(shown, fs, path.rstrip("/") or "/", remote=remote)


def check_no_credentials(uri: str) -> None:
    """Refuse a URI that carries credentials (``user:secret@`` or a secret query option).

    Raises:
        ConfigError: Naming the URI without the secret, and the fix.
    """
    parts = urlsplit(uri)
    secret = [k for k, _ in parse_qsl(parts.query) if _SECRET_KEY.search(k)]
    # abfs://container@account... and hdfs://user@host name no secret; s3://KEY@ does.
    if parts.password is not None or (parts.username and parts.scheme in _CONFIGURABLE_SCHEMES):
        secret.insert(0, "user info")
    if secret:
        raise ConfigError(
            f"storage URI {_shown(uri)} carries credentials ({', '.join(secret)}). "
            f"Fix: {_CREDENTIALS_FIX}."
        )


def _shown(uri: str) -> str:
    """``uri`` without its user info and query (never echo a secret)."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.hostname or ''}{parts.path}"


class StagingDir:
    """A local directory standing in for a remote output location: writers write local files
    atomically into ``local``, :meth:`publish` uploads them to ``location``. For a local
    location the directory IS the location and nothing is copied.
    """

    def __init__(self, location: StorageLocation) -> None:
        self.location = location
        if location.remote:
            self.local = Path(tempfile.mkdtemp(prefix="raytrain-hetero-outputs-"))
            # Removed at the latest when the process exits (a failed job publishes nothing).
            weakref.finalize(self, shutil.rmtree, self.local, ignore_errors=True)
        else:
            self.local = location.local_path

    def fetch(self, name: str) -> Path | None:
        """Download ``name`` from a remote location into the staging directory (a resumed
        run's earlier ``metrics.csv``); its local path, or ``None`` if it is not there."""
        if not self.location.remote:
            path = self.local / name
            return path if path.exists() else None
        source = self.location.join(name)
        if not source.is_file():
            return None
        return source.download(self.local / name)

    def publish(self) -> None:
        """Upload what was written to a remote location, then remove the staging directory
        (local: nothing to do)."""
        if self.location.remote:
            self.location.upload(self.local)
            logger.info("outputs uploaded to %s", self.location)
            self.cleanup()

    def cleanup(self) -> None:
        """Remove the staging directory of a remote location (it was created here)."""
        if self.location.remote:
            shutil.rmtree(self.local, ignore_errors=True)


@dataclass(frozen=True)
class RememberedCost:
    """A worker's step cost t(b) = alpha + beta * b seconds, as an earlier run measured it.

    Attributes:
        alpha: Fixed seconds per step. beta: Seconds per sample.
    """

    alpha: float
    beta: float


class CostModelStore:
    """Cost models measured by earlier runs, one small JSON file per key, kept with the runs.

    Lives at ``<storage>/.raytrain_hetero/cost_models/<key>.json``, so every run, restart and Tune
    trial on the same storage shares it; the key (chosen by the worker) changes with the model
    and the worker type, so a changed model or device never finds a stale entry. A cache: an
    unreadable entry is ignored.
    """

    def __init__(self, storage: StorageLocation) -> None:
        self.root = storage.join(".raytrain_hetero", "cost_models")

    def read(self, key: str) -> RememberedCost | None:
        """The cost model stored under ``key``, or None (absent or unreadable)."""
        entry = self.root.join(f"{key}.json")
        try:
            if not entry.is_file():
                return None
            data = json.loads(entry.read_bytes())
            return RememberedCost(float(data["alpha"]), float(data["beta"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring the remembered cost model %s: %s", entry, exc)
            return None

    def write(self, key: str, alpha: float, beta: float, about: dict[str, Any]) -> None:
        """Store t(b) = alpha + beta * b under ``key`` (replacing it), with ``about`` (what
        the key stands for)."""
        entry = self.root.join(f"{key}.json")
        data = {"alpha": float(alpha), "beta": float(beta), "about": about}
        try:
            if not entry.remote:
                atomic_write_json(entry.local_path, data)
                return
            with entry.filesystem.open_output_stream(entry.path) as stream:  # whole-object
                stream.write(json.dumps(data).encode())
        except OSError as exc:  # a cache: training goes on
            logger.warning("could not remember the cost model at %s: %s", entry, exc)
