"""``python -m benchmarks.rent_sim``: the rent planner's mix against the best single type.

Simulated: every plan is priced by the planner's own model
(:mod:`raytrain_hetero.core.rent_model`), from public figures, none measured here:

* **Throughput**: per-GPU ResNet-50 training images/s, published
  (:data:`raytrain_hetero.workloads.rent_data.PUBLISHED_FIGURES`): Lambda's GPU benchmarks
  (PyTorch, synthetic data; AMP and TF32 tables: V100, A10, A100-40GB, H100 SXM) and NVIDIA
  DeepLearningExamples' PyTorch ResNet-50 v1.5 tables (pytorch-21.03; AMP and TF32/FP32:
  V100-16GB, A100-80GB). A GPU's figure prices every instance type carrying it (A10 for
  g5.xlarge's A10G: an estimate twice over). No fixed cost per step (``alpha = 0``).
* **Exchange**: ResNet-50's 25.6 M fp32 gradients (102.2 MB) per step, a ring all-reduce.
  Within one node 0.04 s per full exchange (derived from NVIDIA's 8 x V100 AMP figure:
  7,248 img/s against 8 x 1,200: 0.069 s more per step of 256 per GPU, over the ring's 1.75);
  across nodes 102.2 MB over the slowest member's network as AWS lists it (p3/g5: 10 Gbit/s:
  0.082 s; p4d/p4de: 400 Gbit/s and p5: 3,200 Gbit/s, both taken as the within-node 0.04 s,
  as a network is not faster than the measured NVLink exchange), no overlap with backward.
* **Prices**: the built-in catalog snapshot (SkyPilot's vms.csv v8, AWS us-east-1; see
  :mod:`raytrain_hetero.workloads.rent_data`: a snapshot, not today's prices).
* **Spot losses**: 0.58 per node-hour for every spot type: the mean of SkyPilot's two
  us-east-1 1-node V100 preemption traces (``skypilot-org/spot-traces``,
  ``preemption/1-node/aws-04-22-2023``: us-east-1c 0.34/h, us-east-1f 0.83/h, by
  :func:`~raytrain_hetero.core.rent_catalog.loss_rate_from_trace`); no public trace covers
  the other types, so the V100 rate stands in (an assumption).
* **Start-up, restart, notice**: 300 s, 60 s, 30 s (assumptions; this project measured about
  12 s idle per preemption with notice on a 2-core CPU job, benchmarks/results/preemption).
* **Caps**: the two market scenarios. ``on-demand``: on-demand only, under assumed quotas of
  8 nodes per 1-GPU type, 2 per 4-GPU type and 1 per 8-GPU type. ``spot``: the same
  on-demand quotas plus spot capacity of 4 nodes per 1-GPU type and 1 per 4- or 8-GPU type.

Cases: three jobs (the Lambda AMP and TF32 figures on five instance types, NVIDIA's AMP
figures on three) x ImageNet-1k for 10 and 90 epochs (1,281,167 samples per epoch, global
batch 4,096) x the two scenarios x five limits: deadlines of 1.3, 2 and 4 times the fastest
single type's expected time, and budgets of 1.1 and 2 times the cheapest single type's
expected cost. For each case: the planner's choice and the best single type under the same
rule, the mix's cost saving at the deadline or its time saving within the budget.

``--timing`` also times decisions over a made-up 50-type catalog (100 options).
Writes ``results.md``, ``results.json`` and ``COMMAND`` under ``--output``
(default ``benchmarks/results/rent_sim``).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.rent import (
    RentDecision,
    decide_rent,
    format_cost,
    format_duration,
    rent_options,
)
from raytrain_hetero.core.rent_catalog import InstanceOffer
from raytrain_hetero.core.rent_model import (
    RentExchange,
    RentJob,
    RentModel,
    RentSettings,
    TypeCost,
    estimate_from_published,
)
from raytrain_hetero.workloads.rent_data import PUBLISHED_FIGURES, snapshot_catalog

__all__ = ["CASES", "Case", "CaseResult", "build_cases", "main", "median_saving", "run_case"]

REGION = "us-east-1"
IMAGENET_SAMPLES = 1_281_167
GLOBAL_BATCH = 4096
GRADIENT_BYTES = 25.6e6 * 4  # ResNet-50's fp32 gradients
GBIT = 1e9 / 8  # bytes per second of one Gbit/s
NETWORK_GBIT = {"p3.2xlarge": 10, "p3.8xlarge": 10, "g5.xlarge": 10, "p4d.24xlarge": 400,
                "p4de.24xlarge": 400, "p5.48xlarge": 3200}  # fmt: skip
WITHIN_NODE_S = 0.04
SPOT_LOSS_PER_H = (0.337 + 0.829) / 2
PLANNER = {"startup_s": 300.0, "restart_s": 60.0, "notice_s": 30.0}

#: Job -> instance type -> published figure (per GPU).
JOBS: dict[str, dict[str, str]] = {
    "lambda-amp": {
        "p3.2xlarge": "lambda-resnet50-amp/V100",
        "p3.8xlarge": "lambda-resnet50-amp/V100",
        "g5.xlarge": "lambda-resnet50-amp/A10",
        "p4d.24xlarge": "lambda-resnet50-amp/A100-40GB",
        "p5.48xlarge": "lambda-resnet50-amp/H100-SXM",
    },
    "lambda-tf32": {
        "p3.2xlarge": "lambda-resnet50-tf32/V100",
        "p3.8xlarge": "lambda-resnet50-tf32/V100",
        "g5.xlarge": "lambda-resnet50-tf32/A10",
        "p4d.24xlarge": "lambda-resnet50-tf32/A100-40GB",
        "p5.48xlarge": "lambda-resnet50-tf32/H100-SXM",
    },
    "nvidia-amp": {
        "p3.2xlarge": "nvidia-resnet50-amp/V100",
        "p3.8xlarge": "nvidia-resnet50-amp/V100",
        "p4de.24xlarge": "nvidia-resnet50-amp/A100-80GB",
    },
}
EPOCHS = (10, 90)
DEADLINE_FACTORS = (0.85, 1.3, 2.0, 4.0)
BUDGET_FACTORS = (1.1, 2.0)


def _quota(gpus: float) -> int:
    return 8 if gpus <= 1 else 2 if gpus <= 4 else 1


def _spot_capacity(gpus: float) -> int:
    return 4 if gpus <= 1 else 1


@dataclass(frozen=True)
class Case:
    """One simulated decision: a job, a market scenario and a limit."""

    job: str
    epochs: int
    scenario: str  # "on-demand" or "spot"
    limit: str  # "deadline" or "budget"
    factor: float

    @property
    def name(self) -> str:
        return f"{self.job} {self.epochs}ep {self.scenario} {self.limit} x{self.factor:g}"


@dataclass(frozen=True)
class CaseResult:
    """The decision of a case and its comparison with the best single type."""

    case: Case
    limit_value: float
    decision: RentDecision

    @property
    def mix_chosen(self) -> bool:
        return self.decision.feasible and not self.decision.chosen.is_single

    def row(self) -> dict[str, Any]:
        d = self.decision
        limit = (
            format_duration(self.limit_value)
            if self.case.limit == "deadline"
            else format_cost(self.limit_value)
        )
        return {
            "case": self.case.name,
            "limit": limit,
            "chosen": d.chosen.describe(),
            "time": format_duration(d.chosen.expected_time_s),
            "cost": format_cost(d.chosen.expected_cost),
            "best_single": d.best_single.describe(),
            "single_time": format_duration(d.best_single.expected_time_s),
            "single_cost": format_cost(d.best_single.expected_cost),
            "saving": None if d.saving is None else round(d.saving, 4),
            "feasible": d.feasible,
            "mix": self.mix_chosen,
            "never_worse": _never_worse(self),
        }


CASES: tuple[Case, ...] = tuple(
    Case(job, epochs, scenario, limit, factor)
    for job in JOBS
    for epochs in EPOCHS
    for scenario in ("on-demand", "spot")
    for limit, factors in (("deadline", DEADLINE_FACTORS), ("budget", BUDGET_FACTORS))
    for factor in factors
)


def build_cases() -> tuple[Case, ...]:
    """Every case of the comparison (see the module docstring)."""
    return CASES


def _problem(case: Case) -> tuple[Any, ...]:
    types = JOBS[case.job]
    offers = snapshot_catalog().offers(REGION, types)
    costs = [
        estimate_from_published(t, PUBLISHED_FIGURES[f].samples_per_s, f) for t, f in types.items()
    ]
    caps: dict[str, int] = {}
    for name, offer in offers.items():
        caps[f"{name}:on_demand"] = _quota(offer.accelerator_count)
        caps[f"{name}:spot"] = (
            _spot_capacity(offer.accelerator_count) if case.scenario == "spot" else 0
        )
    planner = RentSettings(max_nodes=caps, **PLANNER)  # type: ignore[arg-type]
    options, findings = rent_options(offers, costs, planner, dict.fromkeys(types, SPOT_LOSS_PER_H))
    job = RentJob(samples=float(IMAGENET_SAMPLES * case.epochs), global_batch=GLOBAL_BATCH)
    exchange = RentExchange(
        across_nodes_s=GRADIENT_BYTES / (10 * GBIT),
        within_node_s=WITHIN_NODE_S,
        per_type_s={t: _across_nodes_s(t) for t in types},
    )
    return options, job, exchange, planner, findings


def _across_nodes_s(instance_type: str) -> float:
    """One full exchange across nodes: the gradient over the type's network, never less than
    the within-node figure (a network is not faster than NVLink's measured exchange)."""
    return max(WITHIN_NODE_S, GRADIENT_BYTES / (NETWORK_GBIT[instance_type] * GBIT))


def run_case(case: Case) -> CaseResult:
    """Decide one case; its limit is set from the single types' own plans."""
    options, job, exchange, planner, findings = _problem(case)
    model = RentModel(options, job, exchange, planner)
    singles = [
        p
        for i, o in enumerate(options)
        for n in range(1, o.max_nodes + 1)
        if (p := model.plan_mix(((i, n),))) is not None
    ]
    if case.limit == "deadline":
        limit = case.factor * min(p.expected_time_s for p in singles)
        decision = decide_rent(options, job, exchange, planner, deadline_s=limit, findings=findings)
    else:
        limit = case.factor * min(p.expected_cost for p in singles)
        decision = decide_rent(options, job, exchange, planner, budget=limit, findings=findings)
    return CaseResult(case, limit, decision)


def _never_worse(result: CaseResult) -> bool:
    """The mix costs no more (deadline) / takes no longer (budget) than the best single."""
    d, single = result.decision, result.decision.best_single
    if result.case.limit == "deadline":
        ok_single = single.expected_time_s <= result.limit_value * (1 + 1e-9)
        return not ok_single or d.chosen.expected_cost <= single.expected_cost * (1 + 1e-9)
    ok_single = single.expected_cost <= result.limit_value * (1 + 1e-9)
    return not ok_single or d.chosen.expected_time_s <= single.expected_time_s * (1 + 1e-9)


def median_saving(results: Sequence[CaseResult], limit: str) -> float | None:
    """Median saving over the ``limit`` cases where a mix was chosen and a single type also
    kept the limit (None: no such case)."""
    savings = [
        r.decision.saving
        for r in results
        if r.case.limit == limit and r.mix_chosen and r.decision.saving is not None
    ]
    return statistics.median(savings) if savings else None


def table(results: Sequence[CaseResult]) -> str:
    """The comparison as a Markdown table."""
    head = (
        "| case | limit | chosen | time | cost | best single type | its time | its cost "
        "| saving |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        row = r.row()
        if row["saving"] is None:
            saving = "no single fits"
        elif not row["feasible"]:
            saving = "infeasible"
        else:
            kind = "cost" if r.case.limit == "deadline" else "time"
            saving = f"{row['saving']:.0%} {kind}" if row["mix"] else "-"
        lines.append(
            f"| {row['case']} | {row['limit']} | {row['chosen']} | {row['time']} | "
            f"{row['cost']} | {row['best_single']} | {row['single_time']} | "
            f"{row['single_cost']} | {saving} |"
        )
    return "\n".join(lines)


def summary(results: Sequence[CaseResult]) -> dict[str, Any]:
    """Counts and medians of the comparison."""
    cost = median_saving(results, "deadline")
    speed = median_saving(results, "budget")
    mixes = [r for r in results if r.mix_chosen]
    return {
        "cases": len(results),
        "mix_chosen": len(mixes),
        "mix_chosen_no_single_fits": sum(1 for r in mixes if r.decision.saving is None),
        "never_worse_violations": sum(1 for r in results if not _never_worse(r)),
        "median_cost_saving_where_mix_chosen": cost,
        "median_time_saving_where_mix_chosen": speed,
        "all_savings_where_mix_chosen": statistics.median(
            [r.decision.saving for r in mixes if r.decision.saving is not None] or [0.0]
        ),
    }


def timing_catalog(types: int = 50, seed: int = 0) -> tuple[Any, ...]:
    """A made-up catalog of ``types`` instance types (1, 4 or 8 GPUs, on demand and spot)."""
    rng = random.Random(seed)
    offers, costs, losses = {}, [], {}
    for i in range(types):
        gpus = rng.choice([1, 1, 1, 4, 8])
        rate = rng.uniform(200, 3000)
        price = gpus * rate / 1000 * rng.uniform(0.6, 2.0)
        name = f"type{i:02d}"
        offers[name] = InstanceOffer(
            name, "r", "G", gpus, 8, price, price * rng.uniform(0.2, 0.6), ("z",)
        )
        costs.append(TypeCost(name, CostModel(rng.uniform(0, 0.02), 1 / rate)))
        losses[name] = rng.uniform(0.05, 1.0)
    planner = RentSettings(**PLANNER)  # type: ignore[arg-type]
    options, _ = rent_options(offers, costs, planner, losses)
    return options, RentJob(IMAGENET_SAMPLES * 30.0, GLOBAL_BATCH), RentExchange(0.05), planner


def time_decisions(repeats: int = 5) -> dict[str, Any]:
    """Seconds per decision over the 50-type catalog (deadlines of 2, 6 and 24 h)."""
    options, job, exchange, planner = timing_catalog()
    seconds, evaluated = [], []
    for _ in range(repeats):
        for hours in (2, 6, 24):
            start = time.perf_counter()
            d = decide_rent(options, job, exchange, planner, deadline_s=hours * 3600.0)
            seconds.append(time.perf_counter() - start)
            evaluated.append(d.evaluated)
    return {
        "types": 50,
        "options": len(options),
        "decisions": len(seconds),
        "median_s": statistics.median(seconds),
        "max_s": max(seconds),
        "median_mixes_priced": statistics.median(evaluated),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/rent_sim"))
    parser.add_argument("--timing", action="store_true", help="also time a 50-type decision")
    args = parser.parse_args(argv)
    results = [run_case(c) for c in build_cases()]
    text = table(results)
    figures = summary(results)
    print(text)
    print()
    for key, value in figures.items():
        print(f"{key}: {value:.1%}" if isinstance(value, float) else f"{key}: {value}")
    report: dict[str, Any] = {"summary": figures, "cases": [r.row() for r in results]}
    if args.timing:
        report["timing"] = {**time_decisions(), "cpu": _cpu_model()}
        t = report["timing"]
        print(
            f"50-type catalog ({t['options']} options): median {t['median_s']:.3f} s, max "
            f"{t['max_s']:.3f} s per decision over {t['decisions']} ({t['cpu']})"
        )
    args.output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output / "results.md", text + "\n")
    atomic_write_text(args.output / "results.json", json.dumps(report, indent=1) + "\n")
    command = "python -m benchmarks.rent_sim " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    atomic_write_text(args.output / "COMMAND", command.strip() + "\n")
    return 0 if figures["never_worse_violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
