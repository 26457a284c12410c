"""deploy/grafana's dashboard names only what the scheduler exports, and shows all of it."""

from __future__ import annotations

import pytest
from grafana_queries import (
    dashboard_queries,
    exported_series,
    load_dashboard,
    query_labels,
    query_metric_names,
)

DASHBOARD = load_dashboard()
QUERIES = dashboard_queries(DASHBOARD)


def test_the_parser_finds_series_labels_and_ignores_promql_words() -> None:
    expr = 'sum by (run) (increase(ray_a_total{SessionName=~"$S", run="x"}[5m])) / ray_b'
    assert query_metric_names(expr) == {"ray_a_total", "ray_b"}
    assert query_labels(expr) == {"run", "SessionName"}
    assert query_metric_names('label_values(ray_c{run=~"$run"}, rank)') == {"ray_c"}
    assert query_labels('label_values(ray_c{run=~"$run"}, rank)') == {"run", "rank"}


def test_dashboard_has_panels_and_a_prometheus_datasource_variable() -> None:
    assert DASHBOARD["uid"] and DASHBOARD["title"]
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert len(DASHBOARD["panels"]) >= 5
    for panel in DASHBOARD["panels"]:
        # Every panel reads the chosen data source, so it works on Ray's provisioned Prometheus.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]


@pytest.mark.parametrize("query", QUERIES, ids=[q.where for q in QUERIES])
def test_every_query_names_an_exported_metric_and_its_labels(query) -> None:
    exported = exported_series()
    names = query_metric_names(query.expr)
    assert names, f"{query.where}: no series in {query.expr!r}"
    unknown = names - set(exported)
    assert not unknown, f"{query.where}: {sorted(unknown)} not exported (have {sorted(exported)})"
    allowed = set().union(*(exported[name] for name in names))
    assert query_labels(query.expr) <= allowed, f"{query.where}: labels not on {sorted(names)}"


def test_every_exported_metric_has_a_panel() -> None:
    shown = set().union(
        *(query_metric_names(q.expr) for q in QUERIES if not q.where.startswith("$"))
    )
    assert shown == set(exported_series())


def test_panel_ids_and_positions_do_not_collide() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        pos = panel["gridPos"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))
        assert pos["x"] + pos["w"] <= 24
