"""Test helpers: the Grafana dashboard in ``deploy/grafana``, read and checked against the code.

The dashboard's PromQL must only name series the scheduler exports
(:data:`raytrain_hetero.driver.scheduler.EXPORTED_METRICS`, with Ray's ``ray_`` prefix) and only
group or filter by their tags or the labels Ray adds to every application metric. The unit tests
and the real-Ray export test both use these helpers, so a renamed metric breaks them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.driver.scheduler import EXPORTED_METRICS

__all__ = [
    "DASHBOARD_PATH",
    "RAY_DEFAULT_LABELS",
    "DashboardQuery",
    "dashboard_queries",
    "exported_series",
    "load_dashboard",
    "query_labels",
    "query_metric_names",
]

#: The dashboard file in this checkout.
DASHBOARD_PATH = (
    Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "raytrain_hetero_dashboard.json"
)

#: Labels Ray attaches to every application metric it exports (seen on Ray 2.60).
RAY_DEFAULT_LABELS = frozenset({"SessionName", "NodeAddress", "WorkerId", "Component", "Version"})

# PromQL words that are not series names (functions, aggregations, grouping keywords).
_PROMQL_WORDS = frozenset(
    {
        "sum", "max", "min", "avg", "count", "by", "without", "increase", "rate", "irate",
        "label_values", "topk", "bottomk", "on", "ignoring", "group_left", "group_right",
    }
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


@dataclass(frozen=True)
class DashboardQuery:
    """One PromQL expression of the dashboard and where it is used.

    Attributes:
        where: Panel title or template variable name.
        expr: The PromQL expression.
    """

    where: str
    expr: str


def load_dashboard(path: Path = DASHBOARD_PATH) -> dict[str, Any]:
    """Read the dashboard JSON (Grafana's import format)."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def dashboard_queries(dashboard: dict[str, Any]) -> list[DashboardQuery]:
    """Every PromQL expression: panel targets and query-type template variables."""
    queries = [
        DashboardQuery(panel["title"], target["expr"])
        for panel in dashboard.get("panels", [])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            expr = query["query"] if isinstance(query, dict) else query
            queries.append(DashboardQuery(f"${variable['name']}", expr))
    return queries


def query_metric_names(expr: str) -> set[str]:
    """Series names an expression reads (every identifier that is not a PromQL word or label)."""
    stripped = _RANGE.sub("", _MATCHERS.sub("", _STRING.sub('""', expr)))
    stripped = _GROUPING.sub("", stripped)
    # label_values(metric, label): the second argument is a label, not a series.
    stripped = re.sub(r"label_values\(([^,]*),[^)]*\)", r"label_values(\1)", stripped)
    return {word for word in _WORD.findall(stripped) if word not in _PROMQL_WORDS}


def query_labels(expr: str) -> set[str]:
    """Labels an expression filters on, groups by or asks label_values for."""
    labels: set[str] = set()
    for matchers in _MATCHERS.findall(_STRING.sub('""', expr)):
        labels.update(_MATCHER_LABEL.findall(matchers))
    for group in _GROUPING.findall(expr):
        labels.update(word.strip() for word in group.split(",") if word.strip())
    labels.update(re.findall(r"label_values\([^,]*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", expr))
    return labels


def exported_series() -> dict[str, frozenset[str]]:
    """Prometheus series name -> the labels it carries (its tags plus Ray's defaults)."""
    return {m.prometheus_name: frozenset(m.tag_keys) | RAY_DEFAULT_LABELS for m in EXPORTED_METRICS}
