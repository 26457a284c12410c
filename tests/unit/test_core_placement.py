"""raytrain_hetero.core.placement: label selectors and slot-by-slot elastic sizing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.placement import (
    NodeCapacity,
    SlotDemand,
    count_placeable_prefix,
    selector_matches,
)


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {}, True),
        ({"pool": "gpu"}, {"pool": "gpu"}, True),
        ({"pool": "gpu"}, {"pool": "cpu"}, False),
        ({"pool": "gpu"}, {}, False),
        ({"pool": "!gpu"}, {"pool": "cpu"}, True),
        ({"pool": "!gpu"}, {}, True),
        ({"pool": "!gpu"}, {"pool": "gpu"}, False),
        ({"pool": "in(a100, h100)"}, {"pool": "h100"}, True),
        ({"pool": "in(a100,h100)"}, {"pool": "t4"}, False),
        ({"pool": "!in(a100,h100)"}, {"pool": "t4"}, True),
        ({"pool": "!in(a100,h100)"}, {"pool": "a100"}, False),
        ({"pool": "gpu", "zone": "a"}, {"pool": "gpu", "zone": "b"}, False),
    ],
)
def test_selector_syntax(selector, labels, expected):
    assert selector_matches(selector, labels) is expected


def test_head_with_cpus_is_not_room_for_a_labelled_worker():
    # Ray Train's own count would see 4 + 2 CPUs = room for 3 one-CPU workers.
    slots = [SlotDemand({"CPU": 1}, {"pool": "w"}) for _ in range(3)]
    nodes = {
        "head": NodeCapacity({"CPU": 4}, {}),
        "w1": NodeCapacity({"CPU": 2}, {"pool": "w"}),
    }
    assert count_placeable_prefix(slots, nodes) == 2


def test_gpu_slot_needs_a_gpu_node_and_counts_a_prefix():
    slots = [
        SlotDemand({"CPU": 1, "GPU": 1}, {"pool": "gpu"}),
        SlotDemand({"CPU": 4}, {"pool": "cpu"}),
        SlotDemand({"CPU": 4}, {"pool": "cpu"}),
    ]
    cpu_only = {"c": NodeCapacity({"CPU": 16}, {"pool": "cpu"})}
    # Slot 0 cannot go anywhere, so no prefix fits even though slots 1-2 would.
    assert count_placeable_prefix(slots, cpu_only) == 0
    both = {**cpu_only, "g": NodeCapacity({"CPU": 8, "GPU": 1}, {"pool": "gpu"})}
    assert count_placeable_prefix(slots, both) == 3
    assert count_placeable_prefix(slots, both, max_workers=2) == 2


def test_fractional_resources_and_missing_keys():
    slots = [SlotDemand({"CPU": 0.5, "custom": 0.25}) for _ in range(5)]
    nodes = {"n": NodeCapacity({"CPU": 2.0, "custom": 1.0})}
    assert count_placeable_prefix(slots, nodes) == 4
    assert count_placeable_prefix(slots, {"n": NodeCapacity({"CPU": 8.0})}) == 0


resource_amounts = st.integers(min_value=0, max_value=4)
slot_strategy = st.builds(
    lambda cpu, gpu, pool: SlotDemand(
        {"CPU": float(cpu + 1), "GPU": float(gpu)}, {"pool": pool} if pool else {}
    ),
    resource_amounts,
    st.integers(0, 1),
    st.sampled_from(["", "a", "b"]),
)
node_strategy = st.builds(
    lambda cpu, gpu, pool: NodeCapacity(
        {"CPU": float(cpu), "GPU": float(gpu)}, {"pool": pool} if pool else {}
    ),
    st.integers(0, 8),
    st.integers(0, 2),
    st.sampled_from(["", "a", "b"]),
)


def _exhaustively_placeable(slots, nodes) -> bool:
    names = list(nodes)
    for assignment in itertools.product(names, repeat=len(slots)):
        used: dict[str, dict[str, float]] = {n: {} for n in names}
        ok = True
        for slot, name in zip(slots, assignment):
            if not selector_matches(slot.label_selector, nodes[name].labels):
                ok = False
                break
            for key, amount in slot.resources.items():
                used[name][key] = used[name].get(key, 0.0) + amount
        if ok and all(
            used[n].get(k, 0.0) <= nodes[n].resources.get(k, 0.0) + 1e-9
            for n in names
            for k in used[n]
        ):
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(
    st.lists(slot_strategy, min_size=1, max_size=4), st.lists(node_strategy, min_size=1, max_size=3)
)
def test_prefix_is_really_placeable_and_never_exceeds_an_exhaustive_search(slots, node_list):
    nodes = {f"n{i}": node for i, node in enumerate(node_list)}
    k = count_placeable_prefix(slots, nodes)
    assert 0 <= k <= len(slots)
    # What greedy claims fits does fit (no placement timeout from over-counting) ...
    assert _exhaustively_placeable(slots[:k], nodes) or k == 0
    # ... and adding capacity never lowers the answer.
    bigger = {
        name: NodeCapacity({key: v + 8 for key, v in node.resources.items()}, node.labels)
        for name, node in nodes.items()
    }
    assert count_placeable_prefix(slots, bigger) >= k
