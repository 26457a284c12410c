"""The terminal view of a training job: a progress bar over global steps, plans as they are
installed and the per-worker table (:class:`ProgressView`, a ``HeteroTrainer.fit`` progress
callback)."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from raytrain_hetero.core.records import StepRecord

if TYPE_CHECKING:
    from raytrain_hetero.driver.telemetry import FitProgress

#: Header of the per-rank layout column of a model-parallel mode's worker table.
LAYOUT_HEADERS = {"conv_split": "kernels", "branches": "branches"}


class ProgressView:
    """Live progress: a tqdm bar over global steps and the per-worker table on plan changes.

    In a model-parallel mode (``layout_dir`` set: the run's folder) the table shows each
    rank's share of the model (kernels per split layer, or branches) in place of its slice,
    from the layout rank 0 writes into each checkpoint; a new layout (a re-split, a restart
    with a new split) is printed when its checkpoint lands.
    """

    def __init__(
        self,
        total_steps: int,
        stream: TextIO = sys.stderr,
        *,
        layout_dir: Path | None = None,
        layout_header: str | None = None,
    ) -> None:
        from tqdm import tqdm

        self.stream = stream
        self.layout_dir = layout_dir
        self.layout_header = layout_header
        self.layout: dict[str, Any] | None = None
        self.bar = tqdm(
            total=total_steps,
            desc="train",
            unit="step",
            file=stream,
            dynamic_ncols=True,
            mininterval=0.5,
        )
        self.steps_done = -1
        self.plan_versions: set[int] = set()
        self.tabled_versions: set[int] = set()
        self.latest: dict[int, StepRecord] = {}
        self.admission_shown = False

    def __call__(self, update: FitProgress) -> None:
        records = update.records
        for record in records:
            self.latest[record.rank] = record
        if records:
            top = max(r.step for r in records)
            if top > self.steps_done:
                self.bar.update(top - max(self.steps_done, -1))
                self.steps_done = top
            rates = [r.global_samples_per_s for r in records if r.rank == 0]
            if rates:
                self.bar.set_postfix(samples_s=f"{statistics.median(rates):.0f}")
        admission = update.admission
        if admission is not None and not self.admission_shown:
            self.admission_shown = True
            self.bar.write(str(admission.get("summary", "")), file=self.stream)
        for plan in update.plans:
            if plan.version in self.plan_versions:
                continue
            self.plan_versions.add(plan.version)
            self.bar.write(
                f"plan v{plan.version} from step {plan.effective_step}: slices "
                f"{list(plan.slices)} ({plan.reason})",
                file=self.stream,
            )
        # Show the table once every rank has measured a step under the newest plan.
        newest = max(self.plan_versions, default=None)
        if (
            newest is not None
            and newest not in self.tabled_versions
            and self.latest
            and all(r.plan_version == newest for r in self.latest.values())
        ):
            self.tabled_versions.add(newest)
            self.bar.write(self.table(), file=self.stream)
        if self.layout_dir is not None and self._new_layout():
            assert self.layout is not None
            self.bar.write(
                f"layout after epoch {self.layout['epoch']}: {_layout_text(self.layout)}",
                file=self.stream,
            )
            self.bar.write(self.table(), file=self.stream)

    def _new_layout(self) -> bool:
        """Read the newest checkpoint's layout; True if it differs from the one shown."""
        from raytrain_hetero.app.train_loop import LAYOUT_FILE

        assert self.layout_dir is not None
        newest: dict[str, Any] | None = None
        for path in self.layout_dir.glob(f"checkpoint_*/{LAYOUT_FILE}"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written
            if newest is None or record["epoch"] > newest["epoch"]:
                newest = record
        if newest is None or (
            self.layout is not None and newest["layout"] == self.layout["layout"]
        ):
            return False
        self.layout = newest
        return True

    def table(self) -> str:
        from raytrain_hetero.app.outputs import format_worker_table

        rows = [r.to_dict() for _, r in sorted(self.latest.items())]
        if self.layout is not None:
            rows = with_layout(rows, self.layout["layout"])
        return format_worker_table(rows, self.layout_header if self.layout_dir else None)

    def close(self) -> None:
        self.bar.close()


def _layout_text(layout: Mapping[str, Any]) -> str:
    return " | ".join(f"rank {rank}: {text}" for rank, text in enumerate(layout["layout"]))


def with_layout(rows: list[dict[str, Any]], per_rank: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` (one per rank) with each rank's share of the model as ``layout``."""
    return [
        {**row, "layout": per_rank[row["rank"]] if row["rank"] < len(per_rank) else None}
        for row in rows
    ]
