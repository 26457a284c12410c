"""A spot preemption with notice on a real multi-node Ray cluster: a worker node is drained
with reason PREEMPTION and a deadline through Ray's own drain API, then removed at the
deadline. The group trains on all three workers to the step it agreed on, checkpoints there
and continues at once on the two that stay: no step is computed twice, every sample is seen
once, and the smaller group starts before the node is gone. The same under
``raytrain_hetero.lightning``: the step callback checkpoints at the agreed step, mid-epoch,
and the smaller group's Trainer resumes there (Lightning's counters in step with the carving).

Ray Train's preemption watcher (off for the other tests, tests/conftest.py) is on here.
"""

from __future__ import annotations

import threading
import time

import ledgers
import pytest
import ray
from lightning_loops import lightning_live_loop
from ray.train import FailureConfig, RunConfig
from test_elastic import cluster, fresh_digest, pool  # noqa: F401 - the module's fixtures
from train_loops import live_loop

from raytrain_hetero import BatchConfig, ElasticConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver._ray_compat import drain_node_for_preemption

pytestmark = pytest.mark.ray

NOTICE_S = 12.0


class _DrainAfterFirstStep:
    """The driver's progress callback: once the three-worker group ran a step, drain the spot
    node with a NOTICE_S deadline through Ray's API and remove it at the deadline."""

    def __init__(self, ray_cluster, spot) -> None:
        self.cluster, self.spot = ray_cluster, spot
        self.drained, self.removed = threading.Event(), threading.Event()
        self.deadline: float | None = None

    def progress(self, update) -> None:
        at_three = [r for r in update.records if r.world_size == 3]
        if not self.drained.is_set() and len({r.step for r in at_three}) >= 1:
            self.deadline = drain_node_for_preemption(
                self.cluster.address, self.spot.node_id, NOTICE_S
            )
            self.drained.set()
            threading.Thread(target=self._remove_at_deadline, daemon=True).start()

    def _remove_at_deadline(self) -> None:
        time.sleep(max(0.0, self.deadline - time.time()))
        if self.spot in self.cluster.worker_nodes:
            self.cluster.remove_node(self.spot)
        self.removed.set()

    def finished(self) -> float:
        """After the fit: the node was drained (and is removed); its deadline."""
        assert self.drained.is_set()
        self.removed.wait(timeout=NOTICE_S + 5)
        return self.deadline


def _set_up_preemption(monkeypatch) -> None:
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")
    # Slower than the resize monitor (1 s): the elastic policy sees the drained node before
    # the workers see the notice, and must not shrink the running group for it.
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "2")
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "8")


def _elastic_trainer(loop, loop_config, pool, tmp_path, name):  # noqa: F811 - pool is a fixture
    """Three workers on the test's pool (ranks 0 and 1 on the 2-CPU node, rank 2 on the spot
    node), B=48, elastic down to two; the hand-off is no failure (``max_failures=0``)."""
    return HeteroTrainer(
        loop,
        train_loop_config=loop_config,
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": pool.name})],
        batch=BatchConfig(global_batch_size=48),
        elastic=ElasticConfig(min_workers=2, resize_monitor_interval_s=1.0),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=0),
        ),
    )


def test_a_preempted_node_hands_off_at_the_agreed_step_and_no_step_runs_twice(
    cluster,  # noqa: F811
    pool,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    _set_up_preemption(monkeypatch)
    pool(2)  # ranks 0 and 1 (Ray Train packs its workers)
    spot = pool(1)  # rank 2, the node taken back
    cluster.wait_for_nodes()
    out = tmp_path / "preempt"
    out.mkdir()
    # B=48: 150 steps in one epoch; ~0.1 s steps: the notice ends well inside the epoch.
    size = 7200
    trainer = _elastic_trainer(
        live_loop,
        {
            "size": size,
            "epochs": 1,
            "out": str(out),
            "checkpoint_every": 25,
            "step_sleep_s": 0.1,
        },
        pool,
        tmp_path,
        "preempt",
    )
    drain = _DrainAfterFirstStep(cluster, spot)
    result = trainer.fit(progress=drain.progress, poll_interval_s=0.5)
    assert result.error is None
    deadline = drain.finished()

    # Every group's restore matches the checkpoint it resumed from, bit for bit.
    starts = ledgers.assert_restores_match(out, fresh_digest())
    assert [s["world"] for s in starts] == [3, 2], starts
    entries = []
    for path in out.glob("ledger_rank*_*.jsonl"):
        mine = ledgers._read_jsonl(path)
        assert len({e["step"] for e in mine}) == len(mine), path  # one rank, one group
        entries.extend(mine)
    last_at_three = max(e["step"] for e in entries if e["world"] == 3)
    # The two-worker group resumes right after the three-worker group's last step: the
    # checkpoint was written at the agreed step, and nothing after it ran.
    assert starts[1]["resume_step"] == last_at_three + 1
    # No global step computed twice: each step was run by exactly one group.
    by_step: dict[int, set[str]] = {}
    for e in entries:
        by_step.setdefault(e["step"], set()).add(e["group"])
    assert all(len(groups) == 1 for groups in by_step.values()), by_step
    assert sorted(by_step) == list(range(150))
    assert last_at_three < 149, "the notice outlasted the epoch: nothing left for 2 workers"
    ledgers.assert_exactly_once(entries, size, [0])
    # The three-worker group's last step ended before the deadline (the checkpoint after it
    # too: the next group resumed from it); the smaller group's first step came one group
    # start after that hand-off, not after the deadline.
    records = sorted(trainer.step_records, key=lambda r: r.time)
    handoff = max(r.time for r in records if r.world_size == 3)
    first_two = min(r.time - r.wall_s for r in records if r.world_size == 2)
    assert handoff <= deadline, (handoff, deadline)
    assert first_two > handoff
    plans_two = [p for p in trainer.plans if p.world_size == 2]
    assert plans_two and "remembered cost models" in plans_two[0].reason, plans_two
    print(
        f"notice {NOTICE_S:.0f} s: {last_at_three + 1} steps done when 3 workers handed off "
        f"{deadline - handoff:.1f} s before the deadline; first step of 2 workers "
        f"{first_two - handoff:.1f} s after the hand-off ({first_two - deadline:+.1f} s "
        "from the deadline)"
    )
    assert ray.is_initialized()


def test_a_lightning_run_checkpoints_mid_epoch_at_the_agreed_step_and_resumes_there(
    cluster,  # noqa: F811
    pool,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The same preemption under ``raytrain_hetero.lightning`` (a LightningModule, epoch-end
    checkpoints only): the step callback checkpoints at the agreed step, mid-epoch, and the
    two-worker group's Trainer resumes from it at the next step, with Lightning's own step
    and batch counters in step with the carving."""
    _set_up_preemption(monkeypatch)
    pool(2)
    spot = pool(1)
    cluster.wait_for_nodes()
    out = tmp_path / "lightning"
    out.mkdir()
    size, steps = 7200, 150  # B=48, one epoch
    trainer = _elastic_trainer(
        lightning_live_loop,
        {"size": size, "epochs": 1, "out": str(out), "step_sleep_s": 0.1},
        pool,
        tmp_path,
        "preempt-lightning",
    )
    drain = _DrainAfterFirstStep(cluster, spot)
    result = trainer.fit(progress=drain.progress, poll_interval_s=0.5)
    assert result.error is None
    drain.finished()

    # The two-worker group's Trainer holds, bit for bit, the model rank 0 had at the
    # checkpoint of its cursor (Lightning restored the mid-epoch checkpoint).
    starts = ledgers.assert_restores_match(out, fresh_digest())
    assert [s["world"] for s in starts] == [3, 2], starts
    entries = []
    for path in out.glob("ledger_rank*_*.jsonl"):
        mine = ledgers._read_jsonl(path)
        assert len({e["step"] for e in mine}) == len(mine), path
        entries.extend(mine)
    last_at_three = max(e["step"] for e in entries if e["world"] == 3)
    assert 0 < last_at_three < steps - 1, "the hand-off was not mid-epoch"
    assert starts[1]["resume_step"] == last_at_three + 1
    by_step: dict[int, set[str]] = {}
    for e in entries:
        by_step.setdefault(e["step"], set()).add(e["group"])
    assert all(len(groups) == 1 for groups in by_step.values()), by_step
    assert sorted(by_step) == list(range(steps))
    ledgers.assert_exactly_once(entries, size, [0])
    # Lightning resumed in step: its global_step and the epoch's batch_idx are the carved
    # step's in both groups (no batch skipped or repeated by its loop).
    for e in entries:
        assert e["lightning_global_step"] == e["step"], e
        assert (e["lightning_epoch"], e["batch_idx"]) == (e["epoch"], e["step_in_epoch"]), e
    # The driver's records agree: three workers up to the hand-off, two after it.
    records = trainer.step_records
    assert max(r.step for r in records if r.world_size == 3) == last_at_three
    assert min(r.step for r in records if r.world_size == 2) == last_at_three + 1
    assert sorted({r.step for r in records}) == list(range(steps))
    print(f"lightning, notice {NOTICE_S:.0f} s: handed off after step {last_at_three} of {steps}")
    assert ray.is_initialized()


def test_the_yaml_jobs_loop_checkpoints_at_the_agreed_step_and_hands_off(
    cluster,  # noqa: F811
    pool,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The same notice, through the YAML job's own loop (``classification_loop``: the
    generated EuroSAT through torchgeo's loader, SmallCNN, ``checkpoint_due()`` mid-epoch):
    the job keeps training to the agreed step, checkpoints there, and two workers resume at
    the next step, so no global step is trained twice and every step of the epoch is run."""
    from raytrain_hetero.app.job import build_trainer, prepare_dataset
    from raytrain_hetero.app.loading import validate_config
    from raytrain_hetero.app.train_loop import classification_loop

    _set_up_preemption(monkeypatch)
    pool(2)
    spot = pool(1)
    cluster.wait_for_nodes()
    job = validate_config(
        {
            "name": "preempt-yaml",
            "data": {
                "dataset": "eurosat",
                "root": str(tmp_path / "eurosat"),
                "generate": {"samples_per_class": 80},
                "bands": "rgb",
            },
            "model": {"name": "small_cnn", "width": 8},
            # B=12 over 3 workers; each step waits >= 0.2 s before its gradient exchange
            # (EMULATION of a slow link): the 12 s notice ends well inside the one epoch.
            "train": {"epochs": 1, "global_batch_size": 12, "lr": 0.05},
            "workers": [
                {
                    "name": "w",
                    "count": 3,
                    "resources": {"CPU": 1},
                    "device": "cpu",
                    "label_selector": {"pool": pool.name},
                    "emulated_collective_delay_s": 0.2,
                }
            ],
            "elastic": {"min_workers": 2, "resize_monitor_interval_s": 1.0},
            "ray": {"address": cluster.address},
            "output_dir": str(tmp_path / "out"),
        },
        source="test job",
    )
    sizes = prepare_dataset(job)
    steps = -(-sizes["train"] // 12)
    trainer = build_trainer(
        job,
        classification_loop,
        RunConfig(
            name="preempt-yaml",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=0),  # the hand-off is no failure
        ),
    )
    drain = _DrainAfterFirstStep(cluster, spot)
    result = trainer.fit(progress=drain.progress, poll_interval_s=0.5)
    assert result.error is None
    deadline = drain.finished()
    records = trainer.step_records
    groups_by_step: dict[int, set[str]] = {}
    for r in records:
        groups_by_step.setdefault(r.step, set()).add(r.group)
    # No global step trained twice (Ray's default would redo every step since the last
    # checkpoint, here the run's start), and the epoch's every step ran.
    assert all(len(g) == 1 for g in groups_by_step.values()), groups_by_step
    assert sorted(groups_by_step) == list(range(steps))
    worlds = {}
    for r in sorted(records, key=lambda r: r.time):
        worlds.setdefault(r.group, r.world_size)
    assert list(worlds.values()) == [3, 2], worlds
    last_at_three = max(r.step for r in records if r.world_size == 3)
    first_at_two = min(r.step for r in records if r.world_size == 2)
    assert first_at_two == last_at_three + 1
    assert last_at_three < steps - 1, "the notice outlasted the epoch: nothing left for 2"
    handoff = max(r.time for r in records if r.world_size == 3)
    assert handoff <= deadline, (handoff, deadline)
    # The epoch-end report (the job's val_accuracy) came from the two-worker group.
    assert result.metrics is not None and "val_accuracy" in result.metrics
