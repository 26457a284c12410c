"""Lightning worker loop of tests/integration/test_preemption.py (imported by reference).

``live_loop``'s data and model as a ``LightningModule``, trained through
``raytrain_hetero.lightning`` with its defaults (``HeteroReportCallback`` at epoch ends, the
step callback's checkpoint at the step agreed after a preemption notice). The ledgers are
``live_loop``'s: each step's sample ids per rank and group, each group's restored model and
cursor (at ``on_train_start``, after Lightning restored the checkpoint), and rank 0's model
at each checkpoint. Each step also records Lightning's own ``global_step`` and
``batch_idx`` beside the carved step, so the test sees Lightning resume in step with it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from ledgers import record_checkpoint, record_restore
from train_loops import make_regression_data, wide_model

import raytrain_hetero as rh


def lightning_live_loop(config: dict) -> None:
    import lightning.pytorch as pl

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.worker.runtime.registry import get_runtime

    x, y, idx = make_regression_data(config["size"], 64, 3, torch.float32)
    info = rh.get_rank_info()
    out = Path(config["out"])
    ledger = (out / f"ledger_rank{info['rank']}_{info['group']}.jsonl").open("a")

    class Task(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = wide_model(64, 3)

        def training_step(self, batch, batch_idx):
            xb, yb, ib = batch
            step = get_runtime().timing.current
            entry = {
                "epoch": step.epoch,
                "step": step.global_step,
                "step_in_epoch": step.step_in_epoch,
                "ids": ib.tolist(),
                "world": info["world_size"],
                "group": info["group"],
                "lightning_epoch": self.trainer.current_epoch,
                "lightning_global_step": self.trainer.global_step,  # before this update
                "batch_idx": batch_idx,
            }
            ledger.write(json.dumps(entry) + "\n")
            ledger.flush()
            if config.get("step_sleep_s"):
                time.sleep(config["step_sleep_s"])
            loss = F.cross_entropy(self.net(xb), yb)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Restores(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            loader = get_runtime().loader
            resume_step = loader.carver.global_step(loader.cursor)
            record_restore(out, info, resume_step, pl_module.net)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            # Before the step callback, which checkpoints at the agreed step.
            if rh.checkpoint_due() and info["rank"] == 0:
                record_checkpoint(out, info, rh.current_step_number() + 1, pl_module.net)

    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[Restores(), rhl.HeteroReportCallback()],
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    dataset = torch.utils.data.TensorDataset(x, y, idx)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8)  # carved by the strategy
    rhl.fit(rhl.prepare_trainer(trainer), Task(), train_dataloaders=loader)
