"""raytrain_hetero.core.placement: label selectors and slot-by-slot elastic sizing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.placement import (
    NodeCapacity,
    Shortfall,
    SlotDemand,
    count_placeable_prefix,
    first_shortfall,
    selector_matches,
    similar_name,
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


# ------------------------------------------------------------------ first_shortfall (issue 48)


def test_three_one_cpu_workers_on_a_two_cpu_node_are_proven_short_of_cpu():
    slots = [SlotDemand({"CPU": 1}) for _ in range(3)]
    nodes = {"laptop": NodeCapacity({"CPU": 2.0, "memory": 8e9})}
    assert first_shortfall(slots, nodes) == Shortfall(
        slot=2, reason="room", resource="CPU", needed=3.0, offered=2.0, proven=True, sharing=3
    )
    assert first_shortfall(slots[:2], nodes) is None


def test_a_typo_of_a_resource_is_named_with_the_resource_it_resembles():
    slots = [SlotDemand({"CPU": 1, "GPUS": 1}) for _ in range(2)]
    nodes = {"n": NodeCapacity({"CPU": 4.0, "GPU": 1.0})}
    found = first_shortfall(slots, nodes)
    assert found is not None
    assert (found.slot, found.reason, found.resource, found.needed, found.offered) == (
        0,
        "resource",
        "GPUS",
        1.0,
        0.0,
    )
    assert found.proven and found.suggestion == "GPU"
    # No GPU anywhere: the name to suggest comes from the names Ray always knows.
    cpu_only = {"n": NodeCapacity({"CPU": 4.0})}
    assert first_shortfall(slots, cpu_only).suggestion is None
    assert first_shortfall(slots, cpu_only, known_resources=("CPU", "GPU")).suggestion == "GPU"
    # A known name is no typo, though no node offers it (not "did you mean 'CPU'?").
    gpu = [SlotDemand({"CPU": 1, "GPU": 1})]
    found = first_shortfall(gpu, cpu_only, known_resources=("CPU", "GPU"))
    assert (found.resource, found.suggestion) == ("GPU", None)


def test_a_greedy_miss_is_not_called_proven():
    # Best fit puts the unlabelled slot on node a (leaving 0), so the pool-a slot finds no
    # room; the other order fits both. Only a proven shortfall may refuse a run.
    slots = [SlotDemand({"CPU": 1}), SlotDemand({"CPU": 1}, {"pool": "a"})]
    nodes = {"a": NodeCapacity({"CPU": 1.0}, {"pool": "a"}), "b": NodeCapacity({"CPU": 2.0})}
    found = first_shortfall(slots, nodes)
    assert (found.slot, found.reason, found.proven) == (1, "room", False)
    assert _exhaustively_placeable(slots, nodes)


def test_a_resource_a_node_offers_is_no_typo_even_if_too_little():
    slots = [SlotDemand({"CPU": 8, "GPU": 1})]
    nodes = {"n": NodeCapacity({"CPU": 2.0, "GPU": 1.0})}
    found = first_shortfall(slots, nodes)
    assert (found.reason, found.resource, found.needed, found.offered) == ("resource", "CPU", 8, 2)
    assert found.suggestion is None


def test_labels_no_node_carries_are_the_reason():
    slots = [SlotDemand({"CPU": 1}), SlotDemand({"CPU": 1}, {"pool": "a100"})]
    nodes = {"n": NodeCapacity({"CPU": 8.0}, {"pool": "cpu"})}
    assert first_shortfall(slots, nodes) == Shortfall(slot=1, reason="labels")


def test_room_taken_by_earlier_slots_is_proven_only_within_their_pool():
    # Slots 0-1 can use only pool a (2 CPUs); slot 2 too: 3 CPUs on 2 is proven short.
    slots = [SlotDemand({"CPU": 1}, {"pool": "a"}) for _ in range(3)]
    nodes = {
        "a": NodeCapacity({"CPU": 2.0}, {"pool": "a"}),
        "b": NodeCapacity({"CPU": 8.0}, {"pool": "b"}),
    }
    found = first_shortfall(slots, nodes)
    assert (found.slot, found.reason, found.proven, found.needed, found.offered) == (
        2,
        "room",
        True,
        3.0,
        2.0,
    )


def test_similar_name():
    assert similar_name("GPUS", ["CPU", "GPU", "memory"]) == "GPU"
    assert similar_name("gpu", ["CPU", "GPU"]) == "GPU"
    assert similar_name("cpus", ["CPU", "GPU"]) == "CPU"
    assert similar_name("fast_tag", ["CPU", "GPU"]) is None
    assert similar_name("GPU", ["GPU"]) is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(slot_strategy, min_size=1, max_size=4), st.lists(node_strategy, min_size=1, max_size=3)
)
def test_a_proven_shortfall_is_never_placeable_and_none_always_is(slots, node_list):
    nodes = {f"n{i}": node for i, node in enumerate(node_list)}
    found = first_shortfall(slots, nodes)
    if found is None:
        assert _exhaustively_placeable(slots, nodes)
        return
    # The slots before the short one are placed (the greedy placement's prefix) ...
    assert found.slot == count_placeable_prefix(slots, nodes)
    # ... and a proof is one: no assignment whatever holds the slots up to it.
    if found.proven:
        assert not _exhaustively_placeable(slots[: found.slot + 1], nodes)
