"""Renting a cluster for one job (issue 45): where, in which markets, under which planner knobs.

The planner itself is :func:`raytrain_hetero.core.rent.decide_rent`; its knobs are the core
dataclass :class:`~raytrain_hetero.core.rent_model.RentSettings` (held here as ``planner``,
defined once there). The YAML file of ``raytrain-hetero rent`` (:mod:`raytrain_hetero.app.rent_schema`)
has this object as its ``rent:`` section.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import PositiveFloat, invalid
from raytrain_hetero.core.rent_model import RentSettings

__all__ = ["RentConfig"]

# Ray 2.60's label key rule (as its own label validation applies it): an optional
# DNS-style prefix and "/", then a name of up to 63 characters.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class RentConfig(HeteroModel):
    """Where and how to rent the nodes of one data-parallel job.

    Attributes:
        region: The catalog's region to rent in.
        zones: Only these availability zones (None: every zone of the region); the spot
            price is the lowest over them, as SkyPilot takes it.
        instance_types: Only these instance types (each needs a cost model); None: every
            type that has one.
        planner: The planner's knobs (start-up, restart and notice seconds, caps per type and
            market, markets, default spot loss rate, search width):
            :class:`~raytrain_hetero.core.rent_model.RentSettings`, or a mapping of its fields.
        instance_label: The node label naming a node's instance type. The cluster's node
            types must carry it (autoscaler v2 ``available_node_types.<t>.labels``): the
            resource request and the training job's worker slots select nodes by it.
        market_label: The node label naming its market (``spot`` or ``on-demand``).
        watch_interval_s: How often ``rent --apply`` looks at the cluster's nodes (a lost
            or draining spot node starts a re-plan; node-seconds are counted for the cost).
    """

    region: str = "us-east-1"
    zones: list[str] | None = None
    instance_types: list[str] | None = None
    planner: RentSettings = Field(default_factory=RentSettings)
    instance_label: str = "raytrain-hetero.io/instance-type"
    market_label: str = "raytrain-hetero.io/market"
    watch_interval_s: PositiveFloat = 1.0

    @field_validator("instance_label", "market_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        prefix, _, name = value.rpartition("/")
        if not _LABEL_NAME.match(name) or (prefix and not _LABEL_PREFIX.match(prefix)):
            raise invalid(
                f"{value!r} is not a Ray node label key",
                "use [dns.prefix/]name with letters, digits, '-', '_' and '.', e.g. "
                "raytrain-hetero.io/instance-type",
            )
        if prefix.startswith("ray.io"):
            raise invalid(
                f"{value!r} uses Ray's reserved prefix ray.io",
                "use a prefix of your own, e.g. raytrain-hetero.io/",
            )
        return value

    @field_validator("planner", mode="before")
    @classmethod
    def _planner_mapping(cls, value: Any) -> Any:
        if isinstance(value, dict) and "markets" in value and isinstance(value["markets"], list):
            value = {**value, "markets": tuple(value["markets"])}
        return value

    @staticmethod
    def market_value(market: str) -> str:
        """The market label's value for a market: ``spot`` or ``on-demand``."""
        return "spot" if market == "spot" else "on-demand"
