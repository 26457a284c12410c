"""Worker loop of tests/integration/test_lightning.py's GeoDataModule run (imported by
reference): torchgeo's L7IrishDataModule, unmodified, through raytrain_hetero.lightning.

Each rank logs every step's boxes as they were collated (before the datamodule's random
augmentations) to ``<out>/ledger-<rank>.jsonl``; after the second step every rank switches
to ``SWITCHED`` shares (a plan agreed at the next uncarved step).
"""

from __future__ import annotations

import json
import os
import traceback
from collections import deque
from pathlib import Path
from typing import Any

SWITCHED = (2.0, 3.0, 5.0)
SWITCH_AFTER_STEP = 1


def datamodule(paths: str) -> Any:
    from torchgeo.datamodules import L7IrishDataModule

    return L7IrishDataModule(paths=paths, batch_size=4, patch_size=16, length=60)


def geo_loop(config: dict) -> None:
    import lightning.pytorch as pl
    import torch
    from torchgeo.datasets import stack_samples
    from torchgeo.trainers import SemanticSegmentationTask

    import raytrain_hetero as rh
    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.worker.runtime.registry import get_runtime

    torch.manual_seed(0)
    dm = datamodule(config["paths"])
    collated: deque = deque()

    def collate(samples: list) -> dict:
        # Validation batches, probe/calibration batches (calibration.make_batch) and the
        # one-sample batch that keys the remembered cost models (known_costs) are not steps.
        probing = any(f.name in ("make_batch", "known_costs") for f in traceback.extract_stack())
        if probing or not (dm.trainer and dm.trainer.training):
            return stack_samples(samples)
        collated.append(
            [[float(q[0].start), float(q[1].start)] for q in (s["bounds"] for s in samples)]
        )
        return stack_samples(samples)

    dm.collate_fn = collate  # observes the carved draws; the datamodule is torchgeo's own
    ledger = Path(config["out"]) / f"ledger-{get_runtime().identity.rank}.jsonl"

    class Ledger(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            step = get_runtime().timing.current
            entry = {
                "pid": os.getpid(),
                "step": step.global_step,
                "epoch": step.epoch,
                "counts": list(step.counts),
                "plan": step.plan_version,
                "boxes": collated.popleft(),
            }
            with ledger.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            if step.global_step == SWITCH_AFTER_STEP:
                rh.update_plan(shares=list(SWITCHED), reason="test switch")

    task = SemanticSegmentationTask(
        model="fcn", in_channels=9, num_classes=5, num_filters=8, loss="ce", lr=0.01
    )
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[Ledger(), rhl.HeteroReportCallback()],
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        num_sanity_val_steps=0,
    )
    rhl.fit(rhl.prepare_trainer(trainer), task, datamodule=dm)
