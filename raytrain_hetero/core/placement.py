"""How many worker slots of a heterogeneous group the nodes can hold (elastic sizing).

Ray Train V2 decides an elastic group's size by dividing each node's resources by one
``resources_per_worker`` dict and ignores label selectors, so a CPU-only head node counts as
room for a GPU-node worker, and the placement then times out. A group of ``k`` workers in
raytrain_hetero always uses worker slots ``0..k-1`` (placement-group bundle i is slot i), so
the question is the longest prefix of slots that fits, each slot with its *own* resources and
label selector.

Label selectors follow Ray's syntax: ``"v"`` (equal), ``"!v"`` (not equal, absent matches),
``"in(a,b)"`` and ``"!in(a,b)"``.

Before a run, :func:`first_shortfall` answers the other question with the same placement: can
the whole group be placed, and if not, which slot cannot, which resource or label is missing,
and whether *no* placement could hold it (a proof, so the driver may refuse the run at once)
or only the greedy one found none.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "NodeCapacity",
    "Shortfall",
    "SlotDemand",
    "count_placeable_prefix",
    "first_shortfall",
    "selector_matches",
    "similar_name",
]

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


def _place(
    slots: Sequence[SlotDemand], nodes: Mapping[str, NodeCapacity], limit: int
) -> tuple[int, dict[str, dict[str, float]]]:
    """Place ``slots[:limit]`` in order, each on the matching node that leaves the least of
    the slot's resources behind (best fit, ties by node id); stop at the first that fits
    nowhere. Returns how many were placed and what every node has left."""
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
    return placed, remaining


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
    return _place(slots, nodes, limit)[0]


@dataclass(frozen=True)
class Shortfall:
    """Why worker slot ``slot`` cannot be placed together with the slots before it.

    Attributes:
        slot: Index of the first slot the placement could not hold.
        reason: ``"labels"``: no node matches the slot's label selector. ``"resource"``: no
            matching node offers ``needed`` of ``resource`` even when empty (``offered``: the
            most one offers). ``"room"``: the slot fits an empty matching node, but the slots
            before it take the room; when ``proven``, the ``sharing`` slots that can use only
            the slot's matching nodes need ``needed`` of ``resource`` in all and those nodes
            offer ``offered`` in all; otherwise ``needed`` is the slot's own demand and
            ``offered`` the most any matching node has left after the greedy placement.
        resource: The resource that is short (``None`` for ``"labels"``).
        needed: See ``reason``.
        offered: See ``reason``.
        proven: No placement whatever can hold the slots up to ``slot`` (always for
            ``"labels"`` and ``"resource"``); false when only the greedy placement failed,
            and an exhaustive one might succeed.
        sharing: For a proven ``"room"``: how many slots (this one included) compete for
            the matching nodes' ``resource``.
        suggestion: A resource name that some node offers (or one of ``known_resources``)
            and ``resource`` looks like a typo of (``"GPUS"`` -> ``"GPU"``), when no node
            offers ``resource`` at all and it is not a known name itself.
    """

    slot: int
    reason: Literal["labels", "resource", "room"]
    resource: str | None = None
    needed: float = 0.0
    offered: float = 0.0
    proven: bool = True
    sharing: int = 1
    suggestion: str | None = None


def similar_name(name: str, known: Iterable[str]) -> str | None:
    """The name in ``known`` that ``name`` most likely misspells (case-insensitive, difflib),
    or ``None``; never ``name`` itself."""
    by_lower: dict[str, str] = {}
    for candidate in sorted(known):
        if candidate != name:
            by_lower.setdefault(candidate.lower(), candidate)
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _demanded(slot: SlotDemand) -> list[tuple[str, float]]:
    return [(key, amount) for key, amount in slot.resources.items() if amount > _EPSILON]


def first_shortfall(
    slots: Sequence[SlotDemand],
    nodes: Mapping[str, NodeCapacity],
    known_resources: Iterable[str] = (),
) -> Shortfall | None:
    """``None`` if the ``nodes`` can hold every slot at once (the placement of
    :func:`count_placeable_prefix`); else why the first slot it cannot hold does not fit.

    ``known_resources``: resource names that are no typo, and to suggest for one, besides
    those the nodes offer (e.g. ``CPU`` and ``GPU`` on a cluster without GPUs).
    """
    known = set(known_resources)
    placed, remaining = _place(slots, nodes, len(slots))
    if placed == len(slots):
        return None
    slot = slots[placed]
    matching = [n for n in sorted(nodes) if selector_matches(slot.label_selector, nodes[n].labels)]
    if not matching:
        return Shortfall(placed, "labels")
    demand = _demanded(slot)
    for key, amount in demand:
        most = max(nodes[n].resources.get(key, 0.0) for n in matching)
        if most + _EPSILON < amount:
            known = {k for node in nodes.values() for k in node.resources} | set(known)
            suggestion = None if key in known else similar_name(key, known)
            return Shortfall(placed, "resource", key, amount, most, suggestion=suggestion)
    # It fits an empty matching node: the slots before it took the room. Proven when the
    # slots confined to its matching nodes need more of a resource than those nodes have.
    within = set(matching)
    confined = [
        s
        for s in slots[: placed + 1]
        if {n for n in nodes if selector_matches(s.label_selector, nodes[n].labels)} <= within
    ]
    for key, _ in demand:
        need = sum(s.resources.get(key, 0.0) for s in confined)
        have = sum(nodes[n].resources.get(key, 0.0) for n in matching)
        if need > have + _EPSILON:
            return Shortfall(placed, "room", key, need, have, sharing=len(confined))
    key, amount = min(
        demand,
        key=lambda item: max(remaining[n].get(item[0], 0.0) for n in matching) / item[1],
    )
    left = max(remaining[n].get(key, 0.0) for n in matching)
    return Shortfall(placed, "room", key, amount, max(left, 0.0), proven=False)
