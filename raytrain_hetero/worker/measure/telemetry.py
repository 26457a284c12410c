"""The step's telemetry: scalar metrics the loop logged for the step in progress, and the last
step's record (read by the loaders, the API's ``log_step_metrics`` and the step guard)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raytrain_hetero.core.records import StepRecord

__all__ = ["Telemetry"]


@dataclass
class Telemetry:
    """Scalar metrics the loop logged for the step in progress, and the last step's record.

    ``skipped_nonfinite`` is set by the step guard when it skips the step in progress.
    """

    step_metrics: dict[str, float] = field(default_factory=dict)
    last_record: StepRecord | None = None
    skipped_nonfinite: bool = False

    def log(self, metrics: dict[str, float]) -> None:
        """Attach metrics to the step in progress."""
        self.step_metrics.update({k: float(v) for k, v in metrics.items()})

    def take(self) -> dict[str, float]:
        """The step's metrics; the next step starts with none."""
        metrics, self.step_metrics = self.step_metrics, {}
        return metrics

    def take_skipped(self) -> bool:
        """Whether the step guard skipped the step; the next step starts unskipped."""
        skipped, self.skipped_nonfinite = self.skipped_nonfinite, False
        return skipped
