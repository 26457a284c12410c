"""The step's telemetry: scalar metrics the loop logged for the step in progress, the last
step's record (read by the loaders, the API's ``log_step_metrics`` and the step guard), and the
library's own between-step work (``StepRecord.overhead_s``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raytrain_hetero.core.records import StepRecord

__all__ = ["Telemetry"]


@dataclass
class Telemetry:
    """Scalar metrics the loop logged for the step in progress, and the last step's record.

    ``skipped_nonfinite`` is set by the step guard when it skips the step in progress;
    ``overhead_s`` holds the wall seconds of the library's work since the last step ended
    (the next record takes it).
    """

    step_metrics: dict[str, float] = field(default_factory=dict)
    last_record: StepRecord | None = None
    skipped_nonfinite: bool = False
    overhead_s: float = 0.0

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

    def add_overhead(self, seconds: float) -> None:
        """Count ``seconds`` of the library's between-step work towards the next step."""
        self.overhead_s += max(0.0, float(seconds))

    def take_overhead(self) -> float:
        """The between-step work since the last step; the next step starts from zero."""
        seconds, self.overhead_s = self.overhead_s, 0.0
        return seconds
