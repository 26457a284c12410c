"""The stock contender of ``raytrain-hetero bench``: the job as a Ray Train user writes it today.

:func:`stock_loop` runs the job's data, model (same seed), SGD and epochs on a plain
``TorchTrainer`` through ``prepare_model`` (DDP averaging, per-rank BatchNorm) and
``prepare_data_loader`` (a ``DistributedSampler``: equal ``B / N``). EMULATED heterogeneity
applies to stock exactly as to raytrain_hetero, through the one emulator
(:class:`StockEmulation`); otherwise a CPU-only comparison would pit emulated slow workers
against unslowed ones.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raytrain_hetero.worker.measure.emulation import SlowdownSchedule

__all__ = ["StockEmulation", "stock_loop"]

#: Report key of rank 0's step spans: ``[epoch, start, end, samples]`` per step (wall clock).
STEPS_KEY = "bench/steps"


class StockEmulation:
    """Emulated slowdown for a stock DDP model, the stretch raytrain_hetero applies to itself.

    A forward pre-hook marks the start of the step's compute (after DDP's buffer broadcast;
    loading is not stretched); a DDP communication hook sleeps (k - 1) x the compute since then
    (and ``link_delay_s``, a slow link) before each bucket's all-reduce, then runs DDP's default
    all-reduce (sum, divided by the world size).
    """

    def __init__(self, schedule: SlowdownSchedule, device: Any, link_delay_s: float = 0.0) -> None:
        from raytrain_hetero.worker.measure.clock import ComputeClock
        from raytrain_hetero.worker.measure.emulation import SlowdownEmulator

        self.schedule = schedule
        self.emulator = SlowdownEmulator(ComputeClock(device))
        self.link_delay_s = float(link_delay_s)
        self.step = 0  # the loop sets it before each step
        self._gloo_staging = False

    @property
    def factor(self) -> float:
        """The factor of the current step."""
        return self.schedule.factor_at(self.step)

    def start(self, *_: Any) -> None:
        """Forward pre-hook: the step's compute starts now."""
        self.emulator.mark()

    def stretch(self) -> None:
        """Before a collective: sleep (k - 1) x the compute since the last mark, and the link."""
        from raytrain_hetero.worker.measure.emulation import emulate_collective_delay

        self.emulator.stretch(self.factor)
        emulate_collective_delay(self.link_delay_s)

    def install(self, ddp_model: Any) -> None:
        """Register the pre-hook on the inner module and the stretching comm hook on DDP."""
        import torch
        import torch.distributed as dist

        inner = getattr(ddp_model, "module", ddp_model)
        inner.register_forward_pre_hook(self.start)
        if not hasattr(ddp_model, "register_comm_hook"):
            return  # a single worker: no DDP, no collectives
        # DDP checks the hook's annotations as objects, not strings.
        _stretching_allreduce.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        ddp_model.register_comm_hook(self, _stretching_allreduce)
        self._gloo_staging = dist.get_backend() == dist.Backend.GLOO


def _stretching_allreduce(state: StockEmulation, bucket: Any) -> Any:
    """DDP's default all-reduce after the emulated stretch; on gloo a CUDA bucket is staged
    through host memory (what gloo does internally for CUDA tensors anyway)."""
    import torch.distributed as dist

    state.stretch()
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    if tensor.is_cuda and state._gloo_staging:
        staged = tensor.cpu()
        fut = dist.all_reduce(staged, async_op=True).get_future()
        return fut.then(lambda f: tensor.copy_(f.value()[0]))
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def stock_loop(config: dict[str, Any]) -> None:
    """Per-worker loop of the stock contender (see the module docstring).

    ``config``: ``{"job": JobConfig as JSON}``. Rank 0 reports ``val_accuracy`` and its step
    spans (:data:`STEPS_KEY`) with a small checkpoint (Ray Train V2 keeps only the metrics of
    reports that carry one).
    """
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.datasets import open_worker_data
    from raytrain_hetero.worker.measure.emulation import SlowdownSchedule
    from raytrain_hetero.workloads.evaluation import dataset_accuracy

    job = validate_config(config["job"], source="job config on a worker")
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    spec = job.expanded_workers()[rank]
    # Rank i runs worker slot i: one resources dict for every worker is all stock can ask for.
    device = torch.device("cuda:0" if spec.resolved_device() == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, int(spec.resources.get("CPU", 1))))
    torch.manual_seed(job.train.seed)
    _, datasets, model = open_worker_data(job, ("train", "val"))
    model = ray.train.torch.prepare_model(model, move_to_device=device)
    emulation = StockEmulation(
        SlowdownSchedule(
            spec.emulated_slowdown,
            worker=spec.name,
            rank=rank,
            planned=job.emulation.slowdowns,
            noise=job.emulation.noise,
        ),
        device,
        spec.emulated_collective_delay_s,
    )
    emulation.install(model)
    loader = DataLoader(
        datasets["train"],
        batch_size=max(1, job.train.global_batch_size // world),
        shuffle=True,
        num_workers=job.data.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=job.data.num_workers > 0,
    )
    # Adds the DistributedSampler; batches are moved here (a mixed group's GPU rank too).
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=job.train.lr,
        momentum=job.train.momentum,
        weight_decay=job.train.weight_decay,
    )
    spans: list[list[float]] = []
    accuracy = float("nan")
    for epoch in range(job.train.epochs):
        model.train()
        sampler = loader.sampler  # a DistributedSampler unless the group has one worker
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for batch in loader:
            x, y = batch["image"].to(device), batch["label"].to(device)
            started = time.time()  # as raytrain_hetero's step timing: the batch in hand
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            emulation.step += 1
            spans.append([epoch, started, time.time(), int(y.shape[0]) * world])
        if rank == 0:
            inner = getattr(model, "module", model)
            accuracy = dataset_accuracy(inner, datasets["val"], device)
    if rank != 0:
        ray.train.report({})
        return
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "done").write_text("stock contender of raytrain-hetero bench\n")
        ray.train.report(
            {"val_accuracy": accuracy, STEPS_KEY: spans},
            checkpoint=ray.train.Checkpoint.from_directory(directory),
        )
