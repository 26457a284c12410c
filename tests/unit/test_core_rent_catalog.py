"""raytrain_hetero.core.rent_catalog: SkyPilot's vms.csv and spot-trace formats, and the
shipped snapshot (raytrain_hetero.workloads.rent_data)."""

from __future__ import annotations

import pytest

from raytrain_hetero.core.rent_catalog import loss_rate_from_trace, parse_vms_csv
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.rent_data import (
    PUBLISHED_FIGURES,
    VMS_SNAPSHOT_CSV,
    published_figure,
    snapshot_catalog,
)

HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,"
    "Region,AvailabilityZone,Arch\n"
)


def test_offers_take_the_lowest_price_over_zones_and_spot_only_where_quoted():
    catalog = parse_vms_csv(
        HEADER
        + "g.x,A10G,1.0,4.0,16.0,,1.0,0.5,r1,z1,x86_64\n"
        + "g.x,A10G,1.0,4.0,16.0,,1.0,0.4,r1,z2,x86_64\n"
        + "g.x,A10G,1.0,4.0,16.0,,1.0,,r1,z3,x86_64\n"
        + "p.x,V100,4.0,32.0,244.0,,12.0,,r1,z1,x86_64\n"
        + "g.x,A10G,1.0,4.0,16.0,,1.2,0.6,r2,z9,x86_64\n",
        "test.csv",
    )
    assert catalog.regions() == ("r1", "r2")
    offers = catalog.offers("r1", ["g.x", "p.x"])
    assert offers["g.x"].price == 1.0 and offers["g.x"].spot_price == 0.4
    assert offers["g.x"].zones == ("z1", "z2", "z3")
    assert offers["p.x"].spot_price is None and offers["p.x"].accelerator_count == 4.0
    assert catalog.offers("r1", ["g.x"], zones=["z1"])["g.x"].spot_price == 0.5


def test_the_v7_header_without_gpuinfo_and_arch_is_read_too():
    text = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,"
        "AvailabilityZone\nc.x,,,8.0,16.0,0.4,0.1,r,z\n"
    )
    assert parse_vms_csv(text).offers("r", ["c.x"])["c.x"].accelerator_count == 0.0


def test_a_missing_column_names_it_and_the_format():
    with pytest.raises(ConfigError, match=r"lacks the column\(s\) SpotPrice\. Fix: give a CSV"):
        parse_vms_csv(
            "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,"
            "AvailabilityZone\n",
            "mine.csv",
        )


def test_a_price_that_is_not_a_number_names_the_line():
    with pytest.raises(ConfigError, match=r"mine\.csv line 3: Price 'abc' is not a number"):
        parse_vms_csv(HEADER + "a,,,1,1,,1.0,,r,z,x\nb,,,1,1,,abc,,r,z,x\n", "mine.csv")
    with pytest.raises(ConfigError, match=r"line 2: SpotPrice '-1' is negative"):
        parse_vms_csv(HEADER + "a,,,1,1,,1.0,-1,r,z,x\n")


def test_a_row_without_a_price_is_refused_only_when_the_plan_would_rent_it():
    catalog = snapshot_catalog()
    assert "mac1.metal" in catalog.instance_types("us-east-1")
    catalog.offers("us-east-1", ["g5.xlarge"])  # fine: mac1.metal is not wanted
    with pytest.raises(ConfigError) as info:
        catalog.offers("us-east-1", ["g5.xlarge", "mac1.metal"])
    message = str(info.value)
    assert "mac1.metal in us-east-1 (use1-az4) has no Price" in message
    assert "Fix: write its on-demand dollars per hour there" in message
    assert "\n" not in message


def test_an_unknown_region_names_the_closest():
    with pytest.raises(
        ConfigError, match=r"region 'us-east-7' is not in the catalog .*closest: us-east-1.*Fix"
    ):
        snapshot_catalog().offers("us-east-7", ["g5.xlarge"])


def test_a_type_not_listed_in_the_region_names_the_closest():
    with pytest.raises(
        ConfigError,
        match=r"'g5.2xlarge' has a cost model but no row in us-west-2.*closest: g5.xlarge",
    ):
        snapshot_catalog().offers("us-west-2", ["g5.2xlarge"])


def test_the_snapshot_carries_the_catalog_prices():
    offers = snapshot_catalog().offers(
        "us-east-1", ["g5.xlarge", "p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "m8i.xlarge"]
    )
    assert offers["g5.xlarge"].price == 1.006 and offers["g5.xlarge"].spot_price == 0.4246
    assert offers["p3.2xlarge"].spot_price == 0.3707
    assert offers["p4d.24xlarge"].accelerator_count == 8.0
    assert offers["p5.48xlarge"].price == 55.04
    assert offers["m8i.xlarge"].accelerator_count == 0.0
    assert VMS_SNAPSHOT_CSV.startswith("InstanceType,AcceleratorName,AcceleratorCount")


def test_published_figures_are_named_and_cited():
    assert published_figure("lambda-resnet50-amp/A10").samples_per_s == 638.0
    assert all(f.source for f in PUBLISHED_FIGURES.values())
    with pytest.raises(ConfigError, match=r"no published figure 'lambda/x'\. Fix: use one of"):
        published_figure("lambda/x")


# ----------------------------------------------------------------------------- spot traces


def test_a_one_node_trace_counts_rises_over_the_held_hours():
    # 0 = spot held, 1 = lost (SkyPilot's simulator: spot_available = not trace[tick]).
    trace = {"metadata": {"gap_seconds": 600}, "data": [0, 0, 0, 1, 1, 0, 0, 0, 1, 0]}
    # 2 losses; 7 held ticks x 600 s = 7/6 h
    assert loss_rate_from_trace(trace) == pytest.approx(2 / (7 / 6))


def test_a_multi_node_trace_counts_lost_nodes():
    trace = {"metadata": {"gap_seconds": 3600}, "data": [0, 2, 1, 4, 0]}
    # rises: +2, +3 = 5 losses; held node-hours: 4 + 2 + 3 + 0 + 4 = 13
    assert loss_rate_from_trace(trace, nodes=4) == pytest.approx(5 / 13)


@pytest.mark.parametrize(
    ("trace", "nodes", "message"),
    [
        ({"data": [0, 1]}, 1, "not a spot-traces file"),
        ({"metadata": {"gap_seconds": 0}, "data": [0]}, 1, "not a spot-traces file"),
        ({"metadata": {"gap_seconds": 30}, "data": []}, 1, "not a spot-traces file"),
        ({"metadata": {"gap_seconds": 30}, "data": [0, 3]}, 1, "give its nodes"),
        ({"metadata": {"gap_seconds": 30}, "data": [0, "x"]}, 1, "tick 1 is 'x'"),
        ({"metadata": {"gap_seconds": 30}, "data": [1, 1]}, 1, "no node is held"),
    ],
)
def test_bad_traces_are_one_line(trace, nodes, message):
    with pytest.raises(ConfigError, match=message) as info:
        loss_rate_from_trace(trace, nodes, source="t.json")
    assert "Fix:" in str(info.value) and "\n" not in str(info.value)
