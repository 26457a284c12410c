"""Experiment tracking besides ``metrics.csv``: TensorBoard and MLflow (both off by default).

:class:`TrackingConfig` is ``HeteroTrainer(tracking=...)`` and the YAML ``tracking:``; each sink
needs its optional package (``pip install 'raytrain_hetero[tracking]'``); the driver writes
them (:mod:`raytrain_hetero.driver.tracking`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.errors import ConfigError

__all__ = ["MLflowConfig", "TensorBoardConfig", "TrackingConfig"]


class TensorBoardConfig(HeteroModel):
    """TensorBoard event files, one run directory per training run (and per Tune trial).

    Attributes:
        enabled: Write event files.
        log_dir: Parent of the run directories (point ``tensorboard --logdir`` here). ``None``:
            ``tensorboard/`` in the job's output directory (YAML job) or in the current
            directory (``HeteroTrainer``).
    """

    enabled: bool = False
    log_dir: Path | None = None


class MLflowConfig(HeteroModel):
    """One MLflow run per training run (and per Tune trial, nested under the search's run).

    Credentials never come from here: MLflow reads them from its environment variables
    (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/``_TOKEN``, the cloud SDKs' own).

    Attributes:
        enabled: Log to MLflow.
        tracking_uri: MLflow tracking URI (``http://host:5000``, ``sqlite:////abs/mlflow.db``,
            ``databricks``); ``None``: MLflow's default (``MLFLOW_TRACKING_URI``).
        experiment_name: MLflow experiment (created if missing); ``None``: the job name
            (YAML) or the Ray run name (``HeteroTrainer``).
        run_name: MLflow run name; ``None``: the Ray Train run name (Tune trials: the trial's).
        artifact_location: Where a *new* experiment keeps its artifacts (``s3://...``, a
            path); ``None``: the tracking server's default.
    """

    enabled: bool = False
    tracking_uri: str | None = None
    experiment_name: str | None = None
    run_name: str | None = None
    artifact_location: str | None = None


class TrackingConfig(HeteroModel):
    """Experiment tracking sinks of a run (both off by default).

    Attributes:
        tensorboard: TensorBoard event files (:class:`TensorBoardConfig`).
        mlflow: MLflow runs (:class:`MLflowConfig`).
    """

    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    mlflow: MLflowConfig = Field(default_factory=MLflowConfig)

    @property
    def active(self) -> bool:
        """Whether any sink is on."""
        return self.tensorboard.enabled or self.mlflow.enabled

    def check_installed(self) -> None:
        """Raise if an enabled sink's package is missing.

        Raises:
            ConfigError: Naming the package and the install command.
        """
        missing = self.missing_packages()
        if missing:
            sinks = " and ".join(f"tracking.{name}.enabled" for name in missing)
            raise ConfigError(
                f"{sinks}: {', '.join(missing)} is not installed. Fix: pip install "
                "'raytrain_hetero[tracking]' (or turn that tracking off)."
            )

    def missing_packages(self) -> list[str]:
        """Packages an enabled sink needs that are not importable (``[]``: all there)."""
        from importlib.util import find_spec

        enabled = {"tensorboard": self.tensorboard.enabled, "mlflow": self.mlflow.enabled}
        missing = []
        for name in (name for name, on in enabled.items() if on):
            try:
                if find_spec(name) is None:
                    missing.append(name)
            except (ImportError, ValueError):  # a None entry in sys.modules, a broken install
                missing.append(name)
        return missing
