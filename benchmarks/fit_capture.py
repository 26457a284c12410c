"""Keep what each ``HeteroTrainer.fit`` of a YAML job measured: its step records and plans.

The benchmark scripts that drive whole YAML jobs (:func:`raytrain_hetero.app.job.run_job`)
need the per-step records and plan history, which ``run_job`` summarises away. This is the
one place that reaches them: it wraps ``HeteroTrainer.fit`` for the rest of the process (a
benchmark script's), keeping the latest fit's records and plans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raytrain_hetero.core.records import StepRecord

__all__ = ["CapturedFit", "capture_fits"]


@dataclass
class CapturedFit:
    """The latest fit's measurements (replaced by each fit, also one that raised).

    Attributes:
        records: Its step records, in the order the driver received them.
        plans: Its plans, as dicts (``Plan.to_dict`` plus the world size).
    """

    records: list[StepRecord] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)


def capture_fits() -> CapturedFit:
    """Wrap ``HeteroTrainer.fit`` in this process; returns the record every fit refreshes."""
    from raytrain_hetero.driver.trainer import HeteroTrainer

    latest = CapturedFit()
    original_fit = HeteroTrainer.fit

    def capturing_fit(self: HeteroTrainer, **kwargs: Any) -> Any:
        try:
            return original_fit(self, **kwargs)
        finally:
            latest.records = list(self.step_records)
            latest.plans = [p.to_dict() for p in self.plans]

    HeteroTrainer.fit = capturing_fit  # type: ignore[method-assign]
    return latest
