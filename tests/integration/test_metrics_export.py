"""The scheduler actor's Ray metrics reach Prometheus's endpoint under the dashboard's names."""

from __future__ import annotations

import time
import urllib.request
import uuid

import ray
from grafana_queries import dashboard_queries, load_dashboard, query_metric_names

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import PolicyConfig
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver.scheduler import create_scheduler, kill_scheduler


def _record(step: int, rank: int, busy_s: float, run: str) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        rank=rank,
        worker=f"w{rank}",
        device="cpu",
        slice=16,
        weight=0.5,
        compute_s=busy_s,
        load_s=0.0,
        busy_s=busy_s,
        samples_per_s=16 / busy_s,
        loss=1.0,
        global_samples_per_s=100.0,
        plan_version=1,
        group="g",
        world_size=2,
        wall_s=busy_s,
        time=time.time(),
    )


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_scheduler_exports_every_series_the_dashboard_queries(ray_local) -> None:
    run_id = f"metrics-{uuid.uuid4().hex[:6]}"
    wanted = set().union(*(query_metric_names(q.expr) for q in dashboard_queries(load_dashboard())))
    actor = create_scheduler(
        run_id,
        policy=PolicyConfig(window_steps=2, confirm_windows=1, min_steps_between_replans=0),
    )
    try:
        plan = Plan(version=1, effective_step=0, slices=(16, 16), costs=(CostModel(0, 0.01),) * 2)
        ray.get(actor.register_group.remote("g", 2, plan), timeout=60)
        # Rank 1 runs 4x slower than the plan assumed: the scheduler decides a re-plan.
        records = [
            _record(s, r, 0.01 if r == 0 else 0.04, run_id) for s in range(6) for r in (0, 1)
        ]
        ray.get(actor.record_steps.remote(records), timeout=60)
        polled = ray.get(actor.poll.remote("g", 1), timeout=60)
        assert polled.pending is not None, "no re-plan was decided"
        port = int(ray.nodes()[0]["MetricsExportPort"])
        deadline = time.monotonic() + 60
        missing = wanted
        while missing and time.monotonic() < deadline:
            time.sleep(1.0)
            lines = [line for line in _scrape(port).splitlines() if f'run="{run_id}"' in line]
            missing = {
                name for name in wanted if not any(line.startswith(name + "{") for line in lines)
            }
        assert not missing, f"not exported within 60 s: {sorted(missing)}"
    finally:
        kill_scheduler(actor, run_id)
