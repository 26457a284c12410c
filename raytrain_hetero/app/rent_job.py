"""``raytrain-hetero rent FILE``: the mix to rent for a job, as a table; ``--apply`` rents it.

Reads a rent file (:mod:`raytrain_hetero.app.rent_schema`), turns it into the planner's
inputs (:func:`~raytrain_hetero.app.rent_inputs.rent_inputs`: the catalog's offers, the cost models measured, remembered or
estimated from published figures, the spot loss rates from rates or traces, the exchange,
the work) and asks :func:`raytrain_hetero.core.rent.decide_rent`. The table lists the Pareto
front of (expected time, expected cost), marks the chosen plan (``>``) and the best single
type (``1``), flags estimates (``*``), and ends with why. With ``--apply`` the plan is rented
and trained (:mod:`raytrain_hetero.app.rent_apply`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from raytrain_hetero.core.rent import RentDecision, decide_rent, format_cost, format_duration
from raytrain_hetero.core.rent_model import RentPlan
from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:  # the YAML layer is imported when the command runs, not to build the parser
    from raytrain_hetero.app.rent_inputs import RentInputs
    from raytrain_hetero.app.rent_schema import RentFile

__all__ = ["add_arguments", "format_decision", "plan_rent", "run_from_args"]

logger = logging.getLogger(__name__)


def plan_rent(rf: RentFile, inputs: RentInputs) -> RentDecision:
    """The planner's decision for the file's deadline or budget."""
    deadline = None if rf.deadline_h is None else rf.deadline_h * 3600.0
    return decide_rent(
        inputs.options,
        inputs.job,
        inputs.exchange,
        inputs.settings,
        deadline_s=deadline,
        budget=rf.budget,
        findings=inputs.findings,
    )


def format_decision(decision: RentDecision, max_rows: int = 15) -> str:
    """The decision as a table: the Pareto front (thinned to ``max_rows``, keeping the chosen
    plan and the best single type), then why."""
    front = list(decision.front)
    keep = {id(p) for p in front[:: max(1, -(-len(front) // max_rows))]}
    rows: list[RentPlan] = [p for p in front if id(p) in keep]
    for extra in (decision.chosen, decision.best_single):
        if all(p.describe() != extra.describe() for p in rows):
            rows.append(extra)
    rows.sort(key=lambda p: (p.expected_time_s, p.expected_cost))
    lines = [
        f"{'':2} {'time':>8} {'cost':>11} {'$/h':>9} {'nodes':>5} {'losses':>6}  mix",
    ]
    for p in rows:
        mark = (">" if p.describe() == decision.chosen.describe() else " ") + (
            "1" if p.describe() == decision.best_single.describe() else " "
        )
        lines.append(
            f"{mark} {format_duration(p.expected_time_s):>8} {format_cost(p.expected_cost):>11} "
            f"{p.price_per_h:>9.2f} {p.total_nodes:>5} {p.expected_losses:>6.2f}  {p.describe()}"
        )
    limit = (
        f"deadline {format_duration(decision.limit)}"
        if decision.objective == "deadline"
        else f"budget {format_cost(decision.limit)}"
    )
    lines.append(
        f"Pareto front of {decision.evaluated} mixes priced ({len(decision.front)} on it); "
        f"> chosen, 1 best single type, * priced from a published figure (estimate); {limit}"
    )
    lines.append(("chosen: " if decision.feasible else "NOT FEASIBLE: ") + decision.reason)
    lines.extend(f"note: {f}" for f in decision.findings)
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raytrain-hetero rent``."""
    parser.add_argument("rent_file", type=Path, help="the rent file (YAML)")
    parser.add_argument(
        "--apply",
        action="store_true",
        help="ask Ray's autoscaler for the chosen nodes, train the file's train_job on them, "
        "re-plan when a spot node is lost or noticed",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="--apply: where rent_report.json and the job's outputs go (default: the job's "
        "output_dir)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="--apply: write into a non-empty output directory (replacing the job's files)",
    )
    parser.add_argument("--json", action="store_true", help="also print the decision as JSON")


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``raytrain-hetero rent``; its exit status (1: not feasible, without ``--apply``)."""
    from raytrain_hetero.app.rent_inputs import decision_dict, rent_inputs
    from raytrain_hetero.app.rent_schema import load_rent_file

    rf = load_rent_file(args.rent_file)
    train_job = None
    if rf.train_job is not None:
        from raytrain_hetero.app.config import load_config

        train_job = load_config(rf.train_job)
    inputs = rent_inputs(rf, None if train_job is None else train_job.train.global_batch_size)
    decision = plan_rent(rf, inputs)
    print(format_decision(decision))
    if args.json:
        print(json.dumps(decision_dict(decision), indent=1))
    if not args.apply:
        return 0 if decision.feasible else 1
    if train_job is None:
        raise ConfigError(
            "--apply needs the job to train: the rent file has no train_job. Fix: add "
            "train_job: job.yaml (a job YAML), or run without --apply."
        )
    from raytrain_hetero.app.rent_apply import apply_rent

    report = apply_rent(
        rf, inputs, decision, train_job, output_dir=args.output, overwrite=args.overwrite
    )
    print(
        f"rented and trained: {format_duration(report.wall_s)} (predicted "
        f"{format_duration(decision.chosen.expected_time_s)}), incurred "
        f"{format_cost(report.incurred_cost)} at catalog prices; report: {report.path}"
    )
    return 0
