"""How many worker slots of a heterogeneous group the nodes can hold (elastic sizing).

Ray Train V2 decides an elastic group's size by dividing each node's resources by one
``resources_per_worker`` dict and ignores label selectors, so a CPU-only head node counts as
room for a GPU-node worker, and the placement then times out. A group of ``k`` workers in
raytrain_hetero always uses worker slots ``0..k-1`` (placement-group bundle i is slot i), so
the question is the longest prefix of slots that fits, each slot with its *own* resources and
label selector.

Label selectors follow Ray's syntax: ``"v"`` (equal), ``"!v"`` (not equal, absent matches),
``"in(a,b)"`` and ``"!in(a,b)"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["NodeCapacity", "SlotDemand", "count_placeable_prefix", "selector_matches"]

# Float resources (fractional CPUs) are compared with this slack.
_EPSILON = 1e-9


@dataclass(frozen=True)
class SlotDemand:
    """What one worker slot needs: its full resources and its label selector."""

    resources: Mapping[str, float]
    label_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeCapacity:
    """What one node offers: resources available to the group and the node's labels."""

    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


def _parse_values(expression: str) -> tuple[str, ...]:
    inner = expression[expression.index("(") + 1 : expression.rindex(")")]
    return tuple(v.strip() for v in inner.split(",") if v.strip())


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies every entry of ``selector``."""
    for key, expression in selector.items():
        value = labels.get(key)
        expression = expression.strip()
        if expression.startswith("!in(") and expression.endswith(")"):
            if value in _parse_values(expression):
                return False
        elif expression.startswith("in(") and expression.endswith(")"):
            if value not in _parse_values(expression):
                return False
        elif expression.startswith("!"):
            if value == expression[1:]:
                return False
        elif value != expression:
            return False
    return True


def _fits(demand: Mapping[str, float], remaining: Mapping[str, float]) -> bool:
    return all(
        amount <= _EPSILON or remaining.get(key, 0.0) + _EPSILON >= amount
        for key, amount in demand.items()
    )


def count_placeable_prefix(
    slots: Sequence[SlotDemand],
    nodes: Mapping[str, NodeCapacity],
    max_workers: int | None = None,
) -> int:
    """Length of the longest prefix of ``slots`` that the ``nodes`` can hold at once.

    Slots are placed in order, each on the matching node that leaves the least of the
    slot's resources behind (best fit, ties by node id, so the answer is deterministic).
    Greedy placement can miss a packing an exhaustive search would find; it then answers
    low, which keeps a group at its size rather than starting one that cannot be placed.
    The answer is at most ``max_workers`` (default ``len(slots)``).
    """
    limit = len(slots) if max_workers is None else min(max_workers, len(slots))
    remaining = {node_id: dict(node.resources) for node_id, node in nodes.items()}
    placed = 0
    for slot in slots[:limit]:
        candidates = [
            node_id
            for node_id in sorted(remaining)
            if selector_matches(slot.label_selector, nodes[node_id].labels)
            and _fits(slot.resources, remaining[node_id])
        ]
        if not candidates:
            break

        def leftover(node_id: str, demand: Mapping[str, float] = slot.resources) -> float:
            return sum(remaining[node_id].get(k, 0.0) - v for k, v in demand.items() if v > 0)

        chosen = min(candidates, key=lambda node_id: (leftover(node_id), node_id))
        for key, amount in slot.resources.items():
            remaining[chosen][key] = remaining[chosen].get(key, 0.0) - amount
        placed += 1
    return placed
