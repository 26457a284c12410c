"""The planner's inputs from a rent file: catalog, offers, cost models, spot losses, work.

:func:`rent_inputs` turns a :class:`~raytrain_hetero.app.rent_schema.RentFile` into
:class:`RentInputs`: the catalog's offers in the region (the file's ``vms.csv`` or the
built-in snapshot, ``catalog_rows`` over it), the cost models (measured, remembered by earlier
runs, :func:`remembered_costs`, or estimated from published figures), the spot loss rates
(given, or read from spot traces), the exchange and the work. Used by
:mod:`raytrain_hetero.app.rent_job` (the command) and :mod:`raytrain_hetero.app.rent_apply`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from raytrain_hetero.app.rent_schema import CostModelEntry, RentFile
from raytrain_hetero.config.rent import RentConfig
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.rent import RentDecision, rent_options
from raytrain_hetero.core.rent_catalog import (
    VMS_COLUMNS,
    InstanceOffer,
    PriceCatalog,
    loss_rate_from_trace,
    parse_vms_csv,
)
from raytrain_hetero.core.rent_model import (
    RentExchange,
    RentJob,
    RentOption,
    RentPlan,
    RentSettings,
    TypeCost,
    estimate_from_published,
)
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.rent_data import published_figure, snapshot_catalog

__all__ = ["RentInputs", "decision_dict", "remembered_costs", "rent_inputs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RentInputs:
    """Everything the planner prices, read from a rent file.

    Attributes:
        config: The file's ``rent:`` section.
        offers: Per instance type with a cost model what it costs in the region.
        costs: Per instance type the job's step cost per worker.
        options: What can be rented (type x market).
        job: The work. exchange: The exchange per group. settings: The planner's knobs.
        findings: Remarks (estimates, options left out).
        catalog_source: The catalog's name (the built-in snapshot says so).
    """

    config: RentConfig
    offers: dict[str, InstanceOffer]
    costs: tuple[TypeCost, ...]
    options: tuple[RentOption, ...]
    job: RentJob
    exchange: RentExchange
    settings: RentSettings
    findings: tuple[str, ...]
    catalog_source: str


def _catalog(rf: RentFile) -> PriceCatalog:
    """The rent file's catalog: its ``catalog`` file or the snapshot, ``catalog_rows`` over it
    (a row replaces the catalog's rows of the same type, region and zone)."""
    if rf.catalog is None:
        base = snapshot_catalog()
    else:
        try:
            text = rf.catalog.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"catalog {rf.catalog}: cannot be read ({exc}). Fix: give the path of a "
                "SkyPilot vms.csv, or omit catalog: for the built-in snapshot."
            ) from exc
        base = parse_vms_csv(text, str(rf.catalog))
    if not rf.catalog_rows:
        return base
    columns = [*VMS_COLUMNS, "GpuInfo", "Arch"]
    lines = [",".join(columns)]
    for i, row in enumerate(rf.catalog_rows):
        unknown = sorted(set(row) - set(columns))
        if unknown:
            raise ConfigError(
                f"catalog_rows[{i}] has unknown column(s) {', '.join(unknown)}. Fix: use the "
                f"vms.csv columns {', '.join(columns)}."
            )
        lines.append(
            ",".join(str(row.get(c, "") if row.get(c) is not None else "") for c in columns)
        )
    added = parse_vms_csv("\n".join(lines) + "\n", "catalog_rows")
    keys = {(r.instance_type, r.region, r.zone) for r in added.rows}
    kept = tuple(r for r in base.rows if (r.instance_type, r.region, r.zone) not in keys)
    return PriceCatalog(rows=kept + added.rows, source=f"{base.source} + catalog_rows")


def remembered_costs(storage: str, match: dict[str, str]) -> list[TypeCost]:
    """Cost models remembered under ``storage`` (``probe.remember``), one per instance type:
    the one entry whose description mentions ``match[type]``.

    Raises:
        ConfigError: No entry, or several, match a type (naming them and the fix).
    """
    from raytrain_hetero.storage import storage_location

    store = storage_location(storage).cost_models()
    entries: list[tuple[str, dict[str, Any]]] = []
    for name, _ in sorted(store.root.find_files(".json")):
        try:
            data = json.loads(store.root.join(name).read_bytes())
            entries.append((name.removesuffix(".json"), data))
        except (OSError, ValueError) as exc:
            logger.warning("ignoring the remembered cost model %s: %s", name, exc)
    costs = []
    for instance_type, text in sorted(match.items()):
        found = [(k, d) for k, d in entries if text in json.dumps(d.get("about", {}))]
        if len(found) != 1:
            what = (
                "no entry"
                if not found
                else f"{len(found)} entries ({', '.join(k for k, _ in found)})"
            )
            raise ConfigError(
                f"remembered cost models under {storage}: {what} mention {text!r} for "
                f"{instance_type}. Fix: give a text only its entry carries (its GPU name, a "
                "worker label), or measure it with raytrain-hetero probe (probe.remember)."
            )
        key, data = found[0]
        costs.append(TypeCost(instance_type, CostModel(float(data["alpha"]), float(data["beta"]))))
        logger.info("cost model of %s remembered under %s (%s)", instance_type, storage, key)
    return costs


def _type_costs(rf: RentFile) -> list[TypeCost]:
    measured = {
        e.instance_type: TypeCost(e.instance_type, CostModel(e.alpha or 0.0, e.beta))
        for e in rf.cost_models
        if e.beta is not None
    }
    if rf.remembered is not None:
        for tc in remembered_costs(rf.remembered.storage, rf.remembered.match):
            measured.setdefault(tc.instance_type, tc)
    costs: list[TypeCost] = []
    for entry in rf.cost_models:
        tc = (
            measured.get(entry.instance_type)
            if entry.beta is not None
            else _estimate(entry, measured)
        )
        assert tc is not None
        costs.append(
            replace(tc, workers_per_node=entry.workers_per_node, startup_s=entry.startup_s)
        )
    listed = {c.instance_type for c in costs}
    costs.extend(tc for name, tc in sorted(measured.items()) if name not in listed)
    return costs


def _estimate(entry: CostModelEntry, measured: dict[str, TypeCost]) -> TypeCost:
    if entry.published is not None:
        figure = published_figure(entry.published)
        rate, source = figure.samples_per_s, f"{figure.name}: {figure.source}"
    else:
        assert entry.samples_per_s is not None and entry.source is not None
        rate, source = entry.samples_per_s, entry.source
    if entry.relative_to is None:
        return estimate_from_published(entry.instance_type, rate, source)
    reference = measured.get(entry.relative_to)
    if reference is None:
        raise ConfigError(
            f"cost model of {entry.instance_type}: relative_to {entry.relative_to!r} is not a "
            "measured type of this file. Fix: measure it (alpha and beta, or remembered), or "
            "drop relative_to."
        )
    ref_rate = (
        published_figure(entry.reference_published).samples_per_s
        if entry.reference_published is not None
        else entry.reference_samples_per_s
    )
    return estimate_from_published(entry.instance_type, rate, source, reference, ref_rate)


def rent_inputs(rf: RentFile, global_batch: int | None = None) -> RentInputs:
    """The planner's inputs from a rent file (``global_batch``: the training job's, when the
    file gives none).

    Raises:
        ConfigError: Any bad input, one line each (a catalog row without a price, a type no
            cost model covers, an unknown region, a bad trace, ...).
    """
    batch = rf.job.global_batch or global_batch
    if batch is None:
        raise ConfigError(
            "job.global_batch is not given and there is no train_job: to take it from. Fix: "
            "set job.global_batch (samples per optimizer step)."
        )
    costs = _type_costs(rf)
    if not costs:
        raise ConfigError(
            "no cost model: the planner cannot price a single instance type. Fix: add "
            "cost_models (measured alpha/beta, or a published figure) or remembered:."
        )
    catalog = _catalog(rf)
    only = rf.rent.instance_types
    priced = [c.instance_type for c in costs if only is None or c.instance_type in only]
    offers = catalog.offers(rf.rent.region, priced, rf.rent.zones)
    losses = dict(rf.spot_loss.rates)
    for name, ref in rf.spot_loss.traces.items():
        try:
            trace = json.loads(ref.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"spot trace {ref.path} of {name}: cannot be read as JSON ({exc}). Fix: give a "
                "file of skypilot-org/spot-traces' format."
            ) from exc
        losses[name] = loss_rate_from_trace(trace, ref.nodes, str(ref.path))
    settings = rf.rent.planner
    options, findings = rent_options(offers, costs, settings, losses, rf.rent.instance_types)
    if rf.catalog is None:
        findings += (f"prices: {catalog.source} (a snapshot, not current prices)",)
    job = RentJob(float(rf.job.samples_per_epoch * rf.job.epochs), int(batch))
    exchange = RentExchange(
        rf.exchange.across_nodes_s, rf.exchange.within_node_s, dict(rf.exchange.per_type_s)
    )
    return RentInputs(
        rf.rent, offers, tuple(costs), options, job, exchange, settings, findings, catalog.source
    )


def decision_dict(decision: RentDecision) -> dict[str, Any]:
    """The decision as plain data (for --json and the report)."""

    def plan(p: RentPlan) -> dict[str, Any]:
        return {
            "mix": p.describe(),
            "nodes": [
                {
                    "instance_type": n.instance_type,
                    "market": n.market,
                    "nodes": n.nodes,
                    "workers": n.workers,
                    "price_per_h": n.price_per_h,
                    "estimate": n.estimate,
                }
                for n in p.nodes
            ],
            "expected_time_s": p.expected_time_s,
            "expected_cost": p.expected_cost,
            "step_s": p.step_s,
            "exchange_s": p.exchange_s,
            "startup_s": p.startup_s,
            "expected_losses": p.expected_losses,
            "price_per_h": p.price_per_h,
        }

    return {
        "objective": decision.objective,
        "limit": decision.limit,
        "feasible": decision.feasible,
        "chosen": plan(decision.chosen),
        "best_single": plan(decision.best_single),
        "saving": decision.saving,
        "reason": decision.reason,
        "findings": list(decision.findings),
        "front": [plan(p) for p in decision.front],
        "evaluated": decision.evaluated,
    }
