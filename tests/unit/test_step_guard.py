"""The step guard on a real 3-process gloo group (no Ray): the worker API's prepare_model, the
weighted DDP hook carrying the non-finite indicator, real optimizers: one through
prepare_optimizer, and plain torch.optim SGD (momentum) and Adam as the README's loop builds
them (guarded by torch's global step hooks)."""

from __future__ import annotations

import pytest
import torch
from gloo_group import run_gloo_group

from raytrain_hetero.config import BackendConfig, BatchConfig, GuardConfig, WorkerSpec
from raytrain_hetero.errors import NonFiniteStepError
from raytrain_hetero.worker.measure.timing import StepInfo
from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime, install_runtime
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity
from raytrain_hetero.worker.sync.guard import StepGuard

SLICES = (3, 5, 4)
WORLD = len(SLICES)
KINDS = ("prepared", "sgd", "adam")
STEPS = 6
NAN_STEP = 2

SETUP = HeteroSetup(
    run_id="guard",
    specs=(WorkerSpec(name="a"), WorkerSpec(name="b"), WorkerSpec(name="c")),
    batch=BatchConfig(global_batch_size=sum(SLICES)),
    backend=BackendConfig(collective_timeout_s=60),
    guard=GuardConfig(max_consecutive_nonfinite=3),
)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(sum(SLICES), 4, generator=g), torch.randint(
        0, 3, (sum(SLICES),), generator=g
    )


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _params(model: torch.nn.Module) -> torch.Tensor:
    module = getattr(model, "module", model)
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


def _momentum(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every state tensor (SGD momentum; Adam moments and step count)."""
    return [t.clone() for s in optimizer.state.values() for t in s.values()]


def _optimizer(kind: str, params) -> torch.optim.Optimizer:
    import raytrain_hetero as rh

    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01, weight_decay=0.01)
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    return rh.prepare_optimizer(sgd) if kind == "prepared" else sgd


def _run(rank, *, kind="prepared", nan_steps=(), skip_batches=(), inf_steps=(), scaler=None):
    """Train STEPS steps with the ``kind`` optimizer; returns params after each step."""
    import raytrain_hetero as rh

    runtime = get_runtime()
    runtime.guard = StepGuard(rank, WORLD, SETUP.guard.max_consecutive_nonfinite)
    model = rh.prepare_model(_model(), sync_batchnorm=False)
    optimizer = _optimizer(kind, model.parameters())
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
    history, skipped, momenta = [_params(model)], [], []
    start = sum(SLICES[:rank])
    for step in range(STEPS):
        if step in skip_batches:
            continue
        runtime.timing.begin(StepInfo(step, 0, step, SLICES, rank, 0))
        x, y = _batch(step)
        x, y = x[start : start + SLICES[rank]], y[start : start + SLICES[rank]]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if rank == 1 and step in nan_steps:
            loss = loss * float("nan")
        if rank == 1 and step in inf_steps:
            loss = loss * float("inf")
        optimizer.zero_grad()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        schedule.step()
        skipped.append(runtime.telemetry.take_skipped())
        runtime.timing.end()
        history.append(_params(model))
        momenta.append(_momentum(optimizer))
    return history, skipped, momenta, runtime.guard.skipped_total


def _rank_main(rank: int, world_size: int) -> dict:
    identity = RankIdentity(setup=SETUP, slot=rank, rank=rank, world_size=world_size)
    install_runtime(WorkerRuntime.start(identity))
    results: dict = {}
    for kind in KINDS:
        results[kind] = _run(rank, kind=kind, nan_steps=(NAN_STEP,))
        results[kind, "reference"] = _run(rank, kind=kind, skip_batches=(NAN_STEP,))
    try:
        _run(rank, nan_steps=(1, 2, 3))
        results["error"] = None
    except NonFiniteStepError as exc:
        results["error"] = str(exc)
    # GradScaler: the scaler owns overflow; the guard neither applies nor counts it.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    results["amp"] = _run(rank, inf_steps=(1, 2, 3, 4), scaler=scaler)
    # No DDP model: the guard falls back to one tiny all-reduce of its own.
    runtime = get_runtime()
    runtime.guard = StepGuard(rank, WORLD, 3)
    grads = [torch.tensor([float("nan") if rank == 0 else 1.0])]
    results["fallback"] = runtime.guard.verdict(7, lambda: grads).ranks
    return results


@pytest.fixture(scope="module")
def results() -> dict:
    return run_gloo_group(_rank_main, WORLD, timeout_s=180)


@pytest.mark.parametrize("kind", KINDS)
def test_a_nonfinite_step_is_skipped_on_every_rank_and_counted(results, kind):
    for rank in range(WORLD):
        history, skipped, momenta, total = results[rank][kind]
        assert skipped == [step == NAN_STEP for step in range(STEPS)]
        assert total == 1
        # No update, no momentum or Adam moment or step count, no weight decay at the skip.
        assert torch.equal(history[NAN_STEP + 1], history[NAN_STEP])
        for before, after in zip(momenta[NAN_STEP - 1], momenta[NAN_STEP]):
            assert torch.equal(before, after)
        assert all(torch.isfinite(p).all() for p in history)
        assert not torch.equal(history[-1], history[NAN_STEP])  # the run went on
    for rank in range(1, WORLD):
        assert torch.equal(results[0][kind][0][-1], results[rank][kind][0][-1])


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_with_a_nan_step_equals_one_that_never_saw_that_batch(results, kind):
    for rank in range(WORLD):
        history, reference = results[rank][kind][0], results[rank][kind, "reference"][0]
        assert torch.equal(history[-1], reference[-1])


def test_consecutive_nonfinite_steps_stop_the_run_naming_step_and_rank(results):
    for rank in range(WORLD):
        error = results[rank]["error"]
        assert error is not None
        assert "3 consecutive" in error and "steps 1..3" in error
        assert "at step 3" in error and "rank(s) [1]" in error
        assert "max_consecutive_nonfinite" in error


def test_gradscaler_overflow_is_the_scalers_business(results):
    for rank in range(WORLD):
        history, skipped, _, total = results[rank]["amp"]
        assert total == 0 and not any(skipped)  # not counted toward the limit
        for step in (1, 2, 3, 4):
            assert torch.equal(history[step + 1], history[step])  # never applied
        assert not torch.equal(history[1], history[0])  # finite steps are applied
        assert not torch.equal(history[-1], history[-2])


def test_without_ddp_the_guard_falls_back_to_one_all_reduce(results):
    assert all(results[rank]["fallback"] == (0,) for rank in range(WORLD))
