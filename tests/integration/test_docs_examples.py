"""The docs' Python examples that train run here, on one shared local Ray (``ray_local``).

Each block is read from its page (by a marker it contains, see
:func:`docs_fixtures.docs_block`) and executed as shown, with only what a laptop cannot
provide swapped: the cluster pools of ``workers=`` become two local 1-CPU workers,
``train_loop_config`` gets small sizes merged in, results go to tmp storage; the names a block
assumes (``build_model``, ``train_dataset``...) come from :mod:`docs_fixtures`. Included
example files run with small sizes through their own arguments. A renamed function, a
changed signature or a loop that no longer trains fails here. Which blocks run where is
listed in tests/unit/test_docs.py (``RUN_BLOCKS``, ``RUN_INCLUDED``).

Five worker-group starts (the Python API page's loop is the README's, checked in
tests/unit/test_docs_examples_run.py, so it is not trained twice); 30-48 generated samples,
1-2 steps per epoch. ~150 CPU-s in all, ~106 s of wall on a lightly loaded 2-core machine.
"""

from __future__ import annotations

from docs_fixtures import REPO, docs_block, run_block


def _fit(page: str, marker: str, run_config, **overrides):
    where, code = docs_block(page, marker)
    namespace = run_block(code, where, run_config=run_config, **overrides)
    return where, namespace


def test_readme_example_trains(ray_local, run_config):
    where, ns = _fit("README.md", "def train_loop", run_config, loop_config={"epochs": 2})
    result, trainer = ns["result"], ns["trainer"]
    assert result.error is None, f"{where}: {result.error}"
    assert trainer.plans and len(trainer.plans[-1].slices) == 2
    # The loop reports without a checkpoint: Ray Train V2 alone would say None.
    assert result.metrics["epoch"] == 1, f"{where}: {result.metrics}"


def test_loop_fragments_run_inside_a_training_loop(ray_local, run_config):
    """The guards page's step and the micro-batch loop of the heterogeneous-workers page, in
    one worker group: the guard fragment prepares the model, optimizer and loader; the
    micro-batch fragment trains a second epoch with them, in parts of at most 4 samples."""
    from docs_fixtures import fragment_loop

    import raytrain_hetero as rh

    guards = docs_block("docs/reliability/guards.md", "prepare_model")
    micro = docs_block("docs/how-to/heterogeneous-workers.md", "micro_batches")
    trainer = rh.HeteroTrainer(
        fragment_loop,
        train_loop_config={
            "fragments": [
                (guards[0], "", guards[1]),
                (micro[0], "opt = optimizer", micro[1]),
            ]
        },
        workers=[rh.WorkerSpec(name="a", max_micro_batch=4), rh.WorkerSpec(name="b")],
        batch=rh.BatchConfig(global_batch_size=24, memory_cap_mode="accumulate"),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None, result.error


def test_model_parallel_page_example_trains(ray_local, run_config):
    where, ns = _fit(
        "docs/how-to/model-parallelism.md",
        "prepare_model_parallel",
        run_config,
        loop_config={"epochs": 1},
    )
    assert "loop" in ns, where


def test_ray_data_example_trains(ray_local, tmp_path, monkeypatch):
    """examples/train_ray_data.py, included by docs/how-to/ray-data.md, on 30 generated
    GeoTIFFs for one epoch (one step of 30 rows over its three workers), in this Ray."""
    import runpy

    monkeypatch.chdir(tmp_path)  # its generated data goes to ./data
    example = runpy.run_path(str(REPO / "examples" / "train_ray_data.py"))
    trainer = example["main"](
        ["--epochs", "1", "--samples-per-class", "3", "--storage-path", str(tmp_path / "runs")]
    )
    assert trainer.plans and len(trainer.plans[-1].slices) == 3
    assert sum(r.slice for r in trainer.step_records) == 30  # every row once, in one epoch


def test_torchgeo_page_example_trains(ray_local, run_config, tmp_path):
    """The torchgeo page's Lightning program: torchgeo's ClassificationTask and
    EuroSATDataModule, unmodified, on a generated EuroSAT (30 images of 32x32) for one epoch."""
    from raytrain_hetero.workloads import generate_eurosat

    root = generate_eurosat(tmp_path / "eurosat", samples_per_class=3, size=32)
    where, ns = _fit(  # the block's .fit() raises if training fails
        "docs/how-to/torchgeo.md",
        'EuroSATDataModule(root=config["root"], batch_size=64)',
        run_config,
        loop_config={"root": str(root), "epochs": 1},
    )
    # What it prints: the last report's accuracy, carried by the Result.
    assert 0.0 <= ns["result"].metrics["val_OverallAccuracy"] <= 1.0, where
