"""Ray Data ingest carved by the plan, end to end on 3 uneven workers (one fit per source).

* Local files: GeoTIFFs read as bytes and decoded by a ``map_batches`` (Ray Data tasks), a
  plan switch mid-epoch, a failure after epoch 0's checkpoint (the new group resumes at the
  epoch boundary through a new stream server), a parquet validation set split unevenly.
* The S3 server's bucket: parquet, an equal start (no probe), the live scheduler and
  ``batchnorm: ghost``: every slice whole groups (the merged tail's remainder on the last
  rank), and every rank's parameters and running statistics those of one device running
  ghost BatchNorm over the same global batches (float64, 1e-10).

Asserted from the per-rank ledgers: every row once per epoch, the same steps on every rank,
each rank's slice the governing plan's, the ragged tail merged as the map-style carving does.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

import pytest
from ledgers import assert_exactly_once, assert_restores_match, committed_ledger, params_digest
from ray.train import FailureConfig, RunConfig
from ray_data_loops import (
    decode_geotiffs,
    fresh_model,
    parquet_features,
    ray_data_loop,
    write_geotiffs,
    write_parquet,
)

from raytrain_hetero import (
    BatchConfig,
    EmulationConfig,
    HeteroTrainer,
    SchedulerConfig,
    WorkerSpec,
)
from raytrain_hetero.core.carving import EpochCarver

pytestmark = pytest.mark.timeout(400)

EXAMPLE = Path(__file__).parents[2] / "examples" / "configs" / "eurosat_ray_data_local.yaml"

WORKERS = [
    WorkerSpec(name="fast"),
    WorkerSpec(name="mid", emulated_slowdown=2.0),
    WorkerSpec(name="slow", emulated_slowdown=4.0),
]


def _check_ledger(
    out, trainer, rows: int, batch: int, epochs: int, column: str, *, ghost: int = 1, dtype=None
) -> list[dict]:
    """Rows once per epoch, step parity, slices per the governing plan (in whole groups of
    ``ghost``, the merged tail's remainder on the last rank); the committed steps."""
    model = fresh_model(column) if dtype is None else fresh_model(column, dtype)
    assert_restores_match(out, params_digest(model))
    entries, _ = committed_ledger(out)
    assert_exactly_once(entries, rows, range(epochs))
    carver = EpochCarver(rows, batch, min_step_size=len(WORKERS) * ghost, shuffle=False)
    steps = carver.steps_per_epoch * epochs
    by_step: dict[int, dict[int, int]] = {}
    for e in entries:
        by_step.setdefault(e["step"], {})[e["rank"]] = len(e["ids"])
    assert sorted(by_step) == list(range(steps)), "every step ran once"
    for step, slices in by_step.items():
        assert sorted(slices) == [0, 1, 2], f"step {step}: not every rank ran it"
        plan = max((p for p in trainer.plans if p.effective_step <= step), key=lambda p: p.version)
        size = carver.step_size(step % carver.steps_per_epoch)
        assert [slices[r] for r in range(3)] == list(plan.split(size)), (step, plan)
        whole = [slices[0], slices[1], slices[2] - size % ghost]
        assert all(n >= ghost and n % ghost == 0 for n in whole), (step, slices)
    return entries


def test_geotiffs_from_local_files_carved_with_a_switch_and_an_epoch_resume(ray_local, tmp_path):
    import ray

    rows, batch, epochs = 82, 16, 2  # 5 steps per epoch: 16 x 4 and 18 (a tail of 2 merged)
    tiles = write_geotiffs(tmp_path / "tiles", rows)
    (tmp_path / "val").mkdir()
    write_parquet(tmp_path / "val", 23)
    train = ray.data.read_binary_files(str(tiles), include_paths=True).map_batches(
        decode_geotiffs, batch_size=8
    )
    val = ray.data.read_parquet(str(tmp_path / "val"))
    out = tmp_path / "ledger"
    out.mkdir()
    trainer = HeteroTrainer(
        ray_data_loop,
        train_loop_config={
            "out": str(out),
            "epochs": epochs,
            "column": "image",
            "replan_at": 1,
            "new_shares": [4.0, 2.0, 1.0],
            "fail_once": True,
            "val": True,
        },
        workers=WORKERS,
        batch=BatchConfig(global_batch_size=batch, fixed_shares=[1.0, 2.0, 3.0]),
        datasets={"train": train, "val": val},
        run_config=RunConfig(
            name="raydata-local",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    assert result.error is None
    assert (out / "failed_once").exists()
    entries = _check_ledger(out, trainer, rows, batch, epochs, "image")
    # The restarted group resumed at the epoch boundary (step 5), not from step 0.
    starts = sorted(
        {
            json.loads(line)["resume_step"]
            for line in (out / "restores_rank0.jsonl").read_text().splitlines()
        }
    )
    assert starts == [0, 5]
    # The switch asked for at step 1 took effect at the first step no rank had fetched (the
    # prefetch held step 2): steps 0-2 at 1:2:3, 3-4 at 4:2:1; the new group starts at 1:2:3.
    sizes = {e["step"]: [] for e in entries}
    for e in sorted(entries, key=lambda e: e["rank"]):
        sizes[e["step"]].append(len(e["ids"]))
    assert sizes[0] == sizes[2] == [3, 5, 8] and sizes[3] == [9, 5, 2]
    assert sizes[4] == [10, 5, 3]  # the merged tail of 18 under 4:2:1
    assert sizes[5] == [3, 5, 8]
    # Decoding ran in Ray Data's tasks, never in a training process.
    trainers = {int((out / f"pid_rank{r}.txt").read_text()) for r in range(3)}
    decoders = {
        pid
        for r in range(3)
        for line in (out / f"decoders_rank{r}.txt").read_text().splitlines()
        for pid in json.loads(line)
    }
    assert decoders and not decoders & trainers
    # Validation: every row once across the ranks in every epoch (uneven counts allowed).
    for epoch in range(epochs):
        got = Counter(
            i
            for r in range(3)
            if (out / f"val_rank{r}_epoch{epoch}.json").exists()
            for i in json.loads((out / f"val_rank{r}_epoch{epoch}.json").read_text())
        )
        assert got == Counter(range(23)), f"epoch {epoch} validation rows"


def test_parquet_from_the_s3_bucket_equal_start_live_scheduler_ghost_batchnorm(
    ray_local, s3_store, tmp_path
):
    import numpy as np
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray
    import torch
    import torch.nn.functional as F

    from raytrain_hetero.worker.sync.batchnorm.convert import convert_ghost_batchnorm
    from raytrain_hetero.worker.sync.batchnorm.ghost import GhostBatchNorm

    # Groups of 4: 6 steps per epoch, 24 x 5 and 30 (a tail of 6 < 3 workers x 1 group
    # merged: 7 groups and 2 samples, which join the last group, on the last rank).
    rows, batch, epochs, ghost = 150, 24, 2, 4
    # Credentials travel in the pickled filesystem to Ray Data's read tasks.
    fs = pafs.S3FileSystem(
        endpoint_override=s3_store.endpoint,
        scheme="http",
        access_key=s3_store.env["AWS_ACCESS_KEY_ID"],
        secret_key=s3_store.env["AWS_SECRET_ACCESS_KEY"],
        region=s3_store.env["AWS_DEFAULT_REGION"],
        # Small files in one PutObject: pyarrow 25's multipart completion fails on moto 5.2.
        allow_delayed_open=True,
    )
    write_parquet(f"{s3_store.bucket}/table", rows, files=4, filesystem=fs)
    train = ray.data.read_parquet(f"{s3_store.bucket}/table", filesystem=fs).map_batches(
        parquet_features
    )
    out = tmp_path / "ledger"
    out.mkdir()
    trainer = HeteroTrainer(
        ray_data_loop,
        train_loop_config={
            "out": str(out),
            "epochs": epochs,
            "column": "x",
            "replan_at": -1,
            "dtype": "float64",
        },
        workers=WORKERS,
        batch=BatchConfig(global_batch_size=batch, batchnorm="ghost", ghost_size=ghost),
        scheduler=SchedulerConfig(
            live=True,
            plan_sync_every=2,
            flush_every=2,
            policy={"window_steps": 2, "confirm_windows": 1, "min_steps_between_replans": 2},
        ),
        emulation=EmulationConfig(slowdowns=[{"rank": 2, "factor": 3.0, "from_step": 0}]),
        datasets={"train": train},
        run_config=RunConfig(name="raydata-s3", storage_path=str(tmp_path / "results")),
    )
    result = trainer.fit()
    assert result.error is None
    first = trainer.plans[0]
    assert first.reason.startswith("equal start") and first.slices == (8, 8, 8)
    assert all(p.quantum == ghost for p in trainer.plans)
    entries = _check_ledger(
        out, trainer, rows, batch, epochs, "x", ghost=ghost, dtype=torch.float64
    )
    # One device running ghost BatchNorm over the same global batches (the ranks' rows of a
    # step in rank order are its stream positions in order).
    table = pq.read_table(f"{s3_store.bucket}/table", filesystem=fs).to_pydict()
    order = np.argsort(table["id"])
    x = np.stack([np.asarray(table[f"x{j}"], dtype=np.float32) for j in range(6)], axis=1)
    x = torch.as_tensor(x[order], dtype=torch.float64)
    y = torch.as_tensor(np.asarray(table["label"])[order])
    model = convert_ghost_batchnorm(fresh_model("x", torch.float64), ghost)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    by_step: dict[int, list] = {}
    for e in sorted(entries, key=lambda e: (e["step"], e["rank"])):
        by_step.setdefault(e["step"], []).extend(e["ids"])
    for step in sorted(by_step):
        ids = torch.as_tensor(by_step[step])
        loss = F.cross_entropy(model(x[ids]), y[ids])
        optim.zero_grad()
        loss.backward()
        optim.step()
    want = model.state_dict()
    assert int(want["1.num_batches_tracked"]) == len(by_step) == 12
    for rank in range(3):
        got = torch.load(out / f"final_rank{rank}.pt", weights_only=True)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            assert torch.allclose(got[key].double(), value.double(), rtol=0, atol=1e-10), (
                rank,
                key,
                (got[key] - value).abs().max(),
            )
    assert isinstance(model[1], GhostBatchNorm)
    fresh = fresh_model("x", torch.float64).state_dict()
    assert (want["1.running_mean"] - fresh["1.running_mean"]).abs().max() > 1e-3  # it moved


def test_yaml_ray_data_source_decodes_the_registered_dataset_in_ray_data(
    ray_local, tmp_path, caplog
):
    """``data.source: ray_data`` (the example config): the pipeline's rows are the train
    split's samples, decoded by the dataset's own reader in Ray Data tasks (no fit here: the
    carving of such a stream is what the fits above prove); ``raytrain-hetero predict`` of the
    test split decodes in Ray Data tasks too, its actors get decoded batches."""
    import logging

    import numpy as np
    import pyarrow.parquet as pq
    import torch
    import yaml

    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.datasets import open_configured_datasets, open_worker_data
    from raytrain_hetero.app.job import prepare_dataset
    from raytrain_hetero.app.predict import predictor_spec, run_predict
    from raytrain_hetero.app.ray_data_source import train_pipeline
    from raytrain_hetero.app.train_loop import _checkpoint_meta
    from raytrain_hetero.inference.predict import ModelPredictor

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["data"].update(root=str(tmp_path / "eurosat"), generate={"samples_per_class": 4})
    job = validate_config(raw, source="test")
    prepare_dataset(job)
    train = open_configured_datasets(job.data, ("train",)).datasets["train"]
    rows = train_pipeline(job).take_all()
    assert len(rows) == len(train)
    labels = sorted(int(r["label"]) for r in rows)
    assert labels == sorted(int(train[i]["label"]) for i in range(len(train)))
    first = train[0]["image"].numpy()
    assert any(np.array_equal(r["image"], first) for r in rows)

    # predict: an untrained model's checkpoint in the training loop's format (model + meta).
    workload, _, model = open_worker_data(job, ("test",))
    checkpoint = tmp_path / "checkpoint_0" / "model.pt"
    checkpoint.parent.mkdir()
    torch.save({"model": model.state_dict(), "meta": _checkpoint_meta(job, workload)}, checkpoint)
    ray_data_log = logging.getLogger("ray.data")
    ray_data_log.addHandler(caplog.handler)
    caplog.clear()
    two_pools = job.model_copy(update={"workers": job.workers[:2]})  # one actor start fewer
    try:
        summary = run_predict(
            two_pools,
            checkpoint,
            output_dir=tmp_path / "predict",
            batch_size=4,
            speeds=[2, 1],
            quiet=True,
        )
    finally:
        ray_data_log.removeHandler(caplog.handler)
    assert summary["source"] == "ray_data"
    # Ray Data's execution plan: the decode runs in a task pool, not fused into the actors.
    plan = next(r.getMessage() for r in caplog.records if "Execution plan" in r.getMessage())
    assert plan.count("TaskPoolMapOperator[MapBatches(decode_rows)->StreamingRepartition") == 2
    assert plan.count("ActorPoolMapOperator[MapBatches(ModelPredictor)]") == 2, plan
    table = pq.read_table(tmp_path / "predict" / "predictions").to_pandas().sort_values("index")
    test = workload.datasets["test"]
    assert table["index"].tolist() == list(range(len(test)))  # every sample once
    assert table["label"].tolist() == [int(test[i]["label"]) for i in range(len(test))]
    assert table.groupby("worker").size().to_dict() == {"fast": 7, "medium": 3}
    # The pools' actors, built here as Ray Data builds them: no dataset, and a batch of bare
    # indices is refused, so the predictions' images came decoded from the Ray Data tasks.
    spec = predictor_spec(job, checkpoint, "test", ())
    actor = ModelPredictor(spec, "fast")
    assert actor.workload is None and spec.decode is not None
    with pytest.raises(KeyError, match="image"):
        actor({"index": np.arange(3)})
    again = actor(spec.decode({"index": np.arange(len(test))}))
    assert again["sample_id"].tolist() == table["sample_id"].tolist()
    assert again["prediction"].tolist() == table["prediction"].tolist()


def test_roles_measure_a_cpu_node_that_feeds_loader_bound_trainers(ray_local, tmp_path):
    """``probe.roles: auto`` on the shared Ray (no fit). On a pipeline whose decode holds a
    CPU slot, the measured delivery grows when the slow worker's CPU is released (1 -> 2 free
    of 4; ideally 2x, less for Ray's per-task overhead on 2 real cores): its feed rate is that
    gain, on the pipeline's own scale, and with trainers far faster than the delivery it
    feeds. Then the example job's app path: the CPU workers but the fastest are candidates,
    the table carries the numbers, and the job trains without the feeders."""
    import ray.data
    import yaml

    from raytrain_hetero import WorkerSpec
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.job import prepare_dataset
    from raytrain_hetero.app.ray_data_source import format_roles_table, job_roles, without_feeders
    from raytrain_hetero.core.allocation import CostModel
    from raytrain_hetero.core.plan import Plan
    from raytrain_hetero.driver.roles import node_roles

    def sleepy_decode(batch: dict) -> dict:
        # Holds a task's CPU slot 0.25 s per row, long next to Ray's per-task overhead on 2
        # cores; a closure (pickled by value), so a new worker process imports nothing heavy.
        time.sleep(0.25 * len(batch["id"]))
        return batch

    fast, slow = CostModel(alpha=1e-4, beta=1e-5), CostModel(alpha=1e-3, beta=1e-2)
    pipeline = ray.data.range(8, override_num_blocks=8).map_batches(
        sleepy_decode, batch_size=None, num_cpus=1
    )
    specs = [WorkerSpec(name="gpu-like", resources={"CPU": 2}), WorkerSpec(name="cpu-node")]
    roles = node_roles(specs, [fast, slow], 64, dataset=pipeline, delivery_rows=8)
    gain = roles.workers[1].feed_samples_per_s
    delivery = roles.pipeline_samples_per_s
    assert 2 < delivery < 6, roles.summary()  # 4/s: one slot, no overhead
    assert 0.2 * delivery < gain < 1.5 * delivery, gain
    # The group decision (mode auto): the fastest trains (never measured as a feeder).
    assert roles.feeders == (1,) and roles.trainers == (0,) and roles.mode == "auto"
    assert roles.workers[0].feed_samples_per_s == 0.0
    assert roles.chosen.samples_per_s == pytest.approx(delivery + gain)
    assert roles.everyone.bound == "pipeline" and roles.gain > roles.margin

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["data"].update(root=str(tmp_path / "eurosat"), generate={"samples_per_class": 4})
    raw["probe"] = {"roles": "auto"}
    raw["workers"] = raw["workers"][::2]  # fast, slow: one candidate, two timed passes
    job = validate_config(raw, source="test")
    prepare_dataset(job)
    plan = Plan.from_costs(job.train.global_batch_size, [fast, slow])
    roles = job_roles(job, plan, ["fast", "slow"])
    assert roles.workers[0].feed_samples_per_s == 0.0  # the fastest is no candidate
    assert 0 < roles.pipeline_samples_per_s < math.inf
    assert 0 in roles.trainers
    kept = [w.name for w in without_feeders(job, roles).workers]
    assert kept == [w.worker for w in roles.workers if w.verdict == "train"]
    table = format_roles_table(roles)
    assert "input pipeline" in table and table.count("TRAIN") == len(roles.trainers)
