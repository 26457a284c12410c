"""Prices and spot losses for renting a cluster: SkyPilot's catalog and spot-trace formats.

Pure: the callers read the files; this module parses their text and answers questions about it.

* **Prices**: SkyPilot's catalog ``vms.csv`` (format version 8, as in the public
  ``skypilot-org/skypilot-catalog`` repository, ``catalogs/v8/<cloud>/vms.csv``): one row per
  instance type and availability zone with the columns ``InstanceType, AcceleratorName,
  AcceleratorCount, vCPUs, MemoryGiB, GpuInfo, Price, SpotPrice, Region, AvailabilityZone,
  Arch``; ``Price`` is the on-demand and ``SpotPrice`` the spot price in dollars per hour, an
  empty cell where there is none. :func:`parse_vms_csv` reads it (``GpuInfo`` and ``Arch`` may
  be absent); :meth:`PriceCatalog.offers` gives one :class:`InstanceOffer` per instance type
  of a region: the on-demand price (the lowest over its zones) and the spot price, the lowest
  over the zones that quote one, as SkyPilot's own catalog code picks them.
* **Spot losses**: a rate per instance type (losses per node-hour), or a trace in SkyPilot's
  spot-traces format (``skypilot-org/spot-traces``: ``{"metadata": {"gap_seconds": N},
  "data": [...]}``, one tick per ``gap_seconds``). That repository's README calls each value
  "the number of available instances"; SkyPilot's own trace simulator
  (``Michaelvll/skypilot-spot-strategy``, ``TraceEnv.spot_available``) reads a non-zero tick
  as *no* spot, and the preemption traces' runs agree with that reading (1 = lost). Here a
  value is the number of the trace's ``nodes`` that are lost at that tick:
  :func:`loss_rate_from_trace` counts each rise as that many losses and divides by the
  node-hours held.
"""

from __future__ import annotations

import csv
import difflib
import io
import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raytrain_hetero.errors import ConfigError

__all__ = [
    "VMS_COLUMNS",
    "InstanceOffer",
    "PriceCatalog",
    "PriceRow",
    "loss_rate_from_trace",
    "parse_vms_csv",
]

#: The columns of SkyPilot's vms.csv (v8) this module reads; GpuInfo and Arch are optional.
VMS_COLUMNS: tuple[str, ...] = (
    "InstanceType",
    "AcceleratorName",
    "AcceleratorCount",
    "vCPUs",
    "MemoryGiB",
    "Price",
    "SpotPrice",
    "Region",
    "AvailabilityZone",
)
_FORMAT_FIX = (
    "give a CSV with SkyPilot's vms.csv (v8) header: InstanceType,AcceleratorName,"
    "AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch"
)


@dataclass(frozen=True)
class PriceRow:
    """One row of a vms.csv: an instance type in one zone.

    Attributes:
        line: Its line in the file (the header is line 1), for error messages.
        instance_type: E.g. ``"g5.xlarge"``.
        accelerator_name: E.g. ``"A10G"``; empty for a CPU-only type.
        accelerator_count: Accelerators per instance (0 for a CPU-only type).
        vcpus: Virtual CPUs per instance.
        memory_gib: Memory per instance.
        price: On-demand dollars per hour, or None (an empty cell).
        spot_price: Spot dollars per hour, or None (no spot quoted in this zone).
        region: E.g. ``"us-east-1"``.
        zone: Availability zone, e.g. ``"use1-az2"`` (empty where the cloud has none).
    """

    line: int
    instance_type: str
    accelerator_name: str
    accelerator_count: float
    vcpus: float
    memory_gib: float
    price: float | None
    spot_price: float | None
    region: str
    zone: str


@dataclass(frozen=True)
class InstanceOffer:
    """What renting one instance type in one region costs.

    Attributes:
        instance_type: The type.
        region: The region.
        accelerator_name: Its accelerator (empty: CPU only).
        accelerator_count: Accelerators per instance.
        vcpus: Virtual CPUs per instance.
        price: On-demand dollars per hour (lowest over its zones).
        spot_price: Spot dollars per hour (lowest over the zones quoting one), or None.
        zones: The zones it is listed in.
    """

    instance_type: str
    region: str
    accelerator_name: str
    accelerator_count: float
    vcpus: float
    price: float
    spot_price: float | None
    zones: tuple[str, ...]


def _number(text: str, what: str, line: int, source: str, *, optional: bool) -> float | None:
    text = text.strip()
    if not text:
        if optional:
            return None
        raise ConfigError(
            f"catalog {source} line {line}: {what} is empty. Fix: write a number there."
        )
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"catalog {source} line {line}: {what} {text!r} is not a number. Fix: write a "
            "number there (dollars per hour for prices)."
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"catalog {source} line {line}: {what} {text!r} is negative or not finite. "
            "Fix: write a number >= 0 there."
        )
    return value


def parse_vms_csv(text: str, source: str = "vms.csv") -> PriceCatalog:
    """Parse the text of a SkyPilot ``vms.csv`` (v8 columns; extra columns are ignored).

    Args:
        text: The file's content.
        source: What to call the file in messages (its path).

    Raises:
        ConfigError: A required column is missing, or a number cannot be read (one line,
            naming the file, the line and the fix). An empty ``Price`` is kept as None:
            :meth:`PriceCatalog.offers` refuses it only for a type the plan would rent.
    """
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in VMS_COLUMNS if c not in header]
    if missing:
        raise ConfigError(
            f"catalog {source} lacks the column(s) {', '.join(missing)}. Fix: {_FORMAT_FIX}."
        )
    rows = []
    for i, raw in enumerate(reader):
        line = i + 2
        name = (raw["InstanceType"] or "").strip()
        region = (raw["Region"] or "").strip()
        if not name or not region:
            raise ConfigError(
                f"catalog {source} line {line}: InstanceType and Region must not be empty. "
                "Fix: fill them in or delete the line."
            )
        count = _number(
            raw["AcceleratorCount"] or "", "AcceleratorCount", line, source, optional=True
        )
        vcpus = _number(raw["vCPUs"] or "", "vCPUs", line, source, optional=True)
        memory = _number(raw["MemoryGiB"] or "", "MemoryGiB", line, source, optional=True)
        rows.append(
            PriceRow(
                line=line,
                instance_type=name,
                accelerator_name=(raw["AcceleratorName"] or "").strip(),
                accelerator_count=count or 0.0,
                vcpus=vcpus or 0.0,
                memory_gib=memory or 0.0,
                price=_number(raw["Price"] or "", "Price", line, source, optional=True),
                spot_price=_number(
                    raw["SpotPrice"] or "", "SpotPrice", line, source, optional=True
                ),
                region=region,
                zone=(raw["AvailabilityZone"] or "").strip(),
            )
        )
    return PriceCatalog(rows=tuple(rows), source=source)


def _closest(value: str, choices: Collection[str]) -> str:
    near = difflib.get_close_matches(value, sorted(choices), n=1)
    return f" (closest: {near[0]})" if near else ""


@dataclass(frozen=True)
class PriceCatalog:
    """The rows of one vms.csv.

    Attributes:
        rows: Every row, in file order.
        source: The file's name in messages.
    """

    rows: tuple[PriceRow, ...]
    source: str

    def regions(self) -> tuple[str, ...]:
        """The regions the catalog lists, sorted."""
        return tuple(sorted({r.region for r in self.rows}))

    def instance_types(self, region: str | None = None) -> tuple[str, ...]:
        """The instance types listed (in ``region``, if given), sorted."""
        return tuple(
            sorted({r.instance_type for r in self.rows if region is None or r.region == region})
        )

    def offers(
        self,
        region: str,
        instance_types: Collection[str],
        zones: Collection[str] | None = None,
    ) -> dict[str, InstanceOffer]:
        """One offer per type of ``instance_types`` in ``region`` (only ``zones``, if given).

        Raises:
            ConfigError: The region is not in the catalog, a type is not listed there (in
                those zones), or a row of a wanted type has no ``Price`` (one line each,
                naming it and the fix).
        """
        regions = self.regions()
        if region not in regions:
            raise ConfigError(
                f"region {region!r} is not in the catalog {self.source}{_closest(region, regions)}; "
                f"it lists {', '.join(regions) or 'no region'}. Fix: set the region to one of "
                "these, or give a catalog that covers it."
            )
        wanted = set(instance_types)
        chosen = [
            r
            for r in self.rows
            if r.region == region
            and r.instance_type in wanted
            and (zones is None or r.zone in zones)
        ]
        for row in chosen:
            if row.price is None:
                raise ConfigError(
                    f"catalog {self.source} line {row.line}: {row.instance_type} in {region} "
                    f"({row.zone or 'no zone'}) has no Price. Fix: write its on-demand dollars "
                    f"per hour there, or drop {row.instance_type} from the cost models."
                )
        offers: dict[str, InstanceOffer] = {}
        for name in sorted(wanted):
            rows = [r for r in chosen if r.instance_type == name]
            if not rows:
                listed = self.instance_types(region)
                where = f"{region}" + (f" zones {sorted(zones)}" if zones is not None else "")
                raise ConfigError(
                    f"instance type {name!r} has a cost model but no row in {where} of the "
                    f"catalog {self.source}{_closest(name, listed)}. Fix: use a type the "
                    "catalog lists there, or add its row."
                )
            spots = [r.spot_price for r in rows if r.spot_price is not None]
            first = rows[0]
            offers[name] = InstanceOffer(
                instance_type=name,
                region=region,
                accelerator_name=first.accelerator_name,
                accelerator_count=first.accelerator_count,
                vcpus=first.vcpus,
                price=min(r.price for r in rows if r.price is not None),
                spot_price=min(spots) if spots else None,
                zones=tuple(sorted({r.zone for r in rows})),
            )
        return offers


def loss_rate_from_trace(trace: Mapping[str, Any], nodes: int = 1, source: str = "trace") -> float:
    """Spot losses per node-hour from a trace in SkyPilot's spot-traces format.

    Each value is how many of the trace's ``nodes`` are lost (no spot) at that tick; a rise
    from ``a`` to ``b`` counts ``b - a`` losses; the node-hours held are the ticks' nodes not
    lost times ``gap_seconds``. A 1-node trace: losses = the 0 -> 1 changes, held = the 0
    ticks.

    Args:
        trace: The parsed JSON: ``{"metadata": {"gap_seconds": N}, "data": [...]}``.
        nodes: Nodes the trace followed (the ``4-node`` traces: 4).
        source: Its name in messages.

    Raises:
        ConfigError: The format is not that, a value is outside ``0..nodes``, or the trace
            holds no node for any tick (one line, naming what and the fix).
    """
    fix = (
        'give {"metadata": {"gap_seconds": N}, "data": [0, 1, ...]} as in skypilot-org/spot-traces'
    )
    metadata = trace.get("metadata") if isinstance(trace, Mapping) else None
    data = trace.get("data") if isinstance(trace, Mapping) else None
    gap = metadata.get("gap_seconds") if isinstance(metadata, Mapping) else None
    if (
        not isinstance(gap, (int, float))
        or isinstance(gap, bool)
        or not math.isfinite(gap)
        or gap <= 0
        or not isinstance(data, Sequence)
        or isinstance(data, (str, bytes))
        or not data
    ):
        raise ConfigError(
            f"spot trace {source}: not a spot-traces file (metadata.gap_seconds > 0 and a "
            f"non-empty data list). Fix: {fix}."
        )
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise ConfigError(
            f"spot trace {source}: nodes={nodes!r}. Fix: give the nodes it followed (>= 1)."
        )
    values: list[int] = []
    for i, v in enumerate(data):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= nodes:
            hint = (
                "; values above 1 count lost nodes of a multi-node trace: give its nodes (e.g. 4)"
                if isinstance(v, int) and not isinstance(v, bool) and v > nodes
                else ""
            )
            raise ConfigError(
                f"spot trace {source}: tick {i} is {v!r}, not a count of lost nodes in "
                f"0..{nodes}{hint}. Fix: {fix}."
            )
        values.append(v)
    losses = sum(max(0, b - a) for a, b in itertools.pairwise(values))
    held_hours = sum(nodes - v for v in values) * float(gap) / 3600.0
    if held_hours <= 0:
        raise ConfigError(
            f"spot trace {source}: no node is held at any tick (every value is {nodes}), so it "
            "gives no loss rate. Fix: use a trace with spot held, or give the rate per hour."
        )
    return losses / held_hours
