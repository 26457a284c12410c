"""``batchnorm: exact | local`` and what each costs in collectives, on a real 3-rank gloo group.

``local`` (stock DDP's semantics) leaves the model's BatchNorm layers alone: each rank
normalises by its own slice's statistics. ``exact`` normalises by the global batch's.
``ghost`` converts them to GhostBatchNorm (groups of its slice, no exchange). The
collective count per step is read by wrapping torch.distributed's collective functions with
counters that call the real ones (the statistics really cross the gloo group).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from gloo_group import run_gloo_group
from ray.train import RunConfig

import raytrain_hetero as rh
from raytrain_hetero.app.config import merge_overrides, parse_override, validate_config
from raytrain_hetero.app.job import build_trainer
from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.driver.trainer import HeteroTrainer
from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity
from raytrain_hetero.worker.sync.batchnorm.convert import convert_batchnorm, convert_ghost_batchnorm

SLICES = (5, 2, 9)
CHANNELS = 3
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "all_to_all_single", "broadcast")


def _batch() -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return torch.randn(sum(SLICES), CHANNELS, 4, 4, generator=g, dtype=torch.float64) * 2 + 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1),
        torch.nn.BatchNorm2d(CHANNELS),
        torch.nn.Tanh(),
        torch.nn.Conv2d(CHANNELS, CHANNELS, 1),
        torch.nn.BatchNorm2d(CHANNELS),
    ).double()


def _slice(rank: int) -> slice:
    start = sum(SLICES[:rank])
    return slice(start, start + SLICES[rank])


def _wrapped_forward(rank: int, world_size: int) -> dict[bool, tuple]:
    """prepare_model under each run setting (as the backend installs it); one training forward
    of this rank's slice."""
    results = {}
    for setting in ("local", "exact", "ghost"):
        setup = HeteroSetup(
            run_id="t",
            specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
            batch=BatchConfig(global_batch_size=sum(SLICES), batchnorm=setting, ghost_size=2),
        )
        identity = RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world_size)
        install_runtime(WorkerRuntime.start(identity))
        model = rh.prepare_model(_model())  # no sync_batchnorm: the setting decides
        layers = [
            m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        ]
        with torch.no_grad():
            out = model(_batch()[_slice(rank)])
        kinds = [type(m).__name__ for m in layers]
        if setting == "ghost":  # groups of 2 of this slice, no exchange (tested at length in
            results["ghost"] = (out, kinds)  # test_ghost_batchnorm.py)
        else:
            results[setting == "exact"] = (out, kinds, layers[0].running_mean.clone())
    return results


def _one_device(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    model = _model()
    with torch.no_grad():
        return model(x), model[1].running_mean.clone()


def _both(rank: int, world_size: int) -> dict[str, dict]:
    """Both tests' figures from one group (a spawn each): the forwards, then the counts (whose
    counters replace torch.distributed's functions in this process for good)."""
    forward = _wrapped_forward(rank, world_size)
    return {"forward": forward, "collectives": _count_collectives(rank, world_size)}


@pytest.fixture(scope="module")
def group_results() -> dict[int, dict[str, dict]]:
    return run_gloo_group(_both, len(SLICES))


def test_local_keeps_per_slice_statistics_and_exact_the_global_ones(group_results):
    results = {rank: both["forward"] for rank, both in group_results.items()}
    whole_out, whole_running = _one_device(_batch())
    for rank, by_setting in results.items():
        out, kinds = by_setting["ghost"]
        assert kinds == ["GhostBatchNorm"] * 2
        alone = convert_ghost_batchnorm(_model(), 2)
        with torch.no_grad():
            torch.testing.assert_close(out, alone(_batch()[_slice(rank)]), rtol=1e-12, atol=1e-12)
    for (rank, by_setting), sync_batchnorm in itertools.product(results.items(), (False, True)):
        out, kinds, running = by_setting[sync_batchnorm]
        if sync_batchnorm:
            assert kinds == ["HeteroBatchNorm"] * 2
            want_out, want_running = whole_out[_slice(rank)], whole_running
        else:
            # Stock DDP's semantics: this slice normalised alone, as if it were the batch.
            assert kinds == ["BatchNorm2d"] * 2
            want_out, want_running = _one_device(_batch()[_slice(rank)])
            assert (out - whole_out[_slice(rank)]).abs().max() > 1e-3  # really not global
        torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(running, want_running, rtol=1e-10, atol=1e-10)


#: Collectives per training step of the test model by case (2 BatchNorm layers).
EXPECTED_COLLECTIVES = {
    # 2 layers x (forward statistics + backward sums), one direct exchange each.
    "train": 4,
    # Running statistics: nothing to exchange.
    "eval": 0,
    # A frozen BatchNorm inside a training model (eval mode, no gradients): only the other.
    "frozen_bn": 2,
    # Nothing before the first layer needs a gradient: its backward exchange would only form
    # an input gradient nobody reads.
    "frozen_stem": 3,
}


def _count_collectives(rank: int, world_size: int) -> dict[str, dict[str, int]]:
    """Per case: collectives of one training forward + backward, by kind."""
    counts: dict[str, int] = {}
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(dist, name, counted)
    out = {}
    for case in EXPECTED_COLLECTIVES:
        counts.update(dict.fromkeys(COLLECTIVES, 0))
        model = convert_batchnorm(_model(), dist.group.WORLD)
        inputs = _batch()[_slice(rank)]
        if case == "eval":
            model.eval()
        elif case == "frozen_bn":
            model[1].eval()
            model[1].requires_grad_(False)
        elif case == "frozen_stem":
            model[0].requires_grad_(False)
        else:
            inputs.requires_grad_()
        model(inputs).square().mean().backward()
        out[case] = dict(counts)
    return out


def test_collectives_per_step(group_results):
    for by_case in (both["collectives"] for both in group_results.values()):
        for case, expected in EXPECTED_COLLECTIVES.items():
            # One hop each: gloo's ring all-reduce would take 2 * (world - 1) = 4 in sequence.
            want = {**dict.fromkeys(COLLECTIVES, 0), "all_to_all_single": expected}
            assert by_case[case] == want, case


def _loop(config):  # never runs
    raise AssertionError


def test_the_setting_reaches_the_workers_setup_from_python_and_yaml():
    workers = [{"name": "a"}, {"name": "b"}]
    default = HeteroTrainer(_loop, workers=workers, batch={"global_batch_size": 8})
    assert default.setup().batch.batchnorm == "exact"
    local = HeteroTrainer(
        _loop, workers=workers, batch=BatchConfig(global_batch_size=8, batchnorm="local")
    )
    assert local.setup().batch.batchnorm == "local"
    data = merge_overrides(
        {"data": {"root": "data/x"}, "workers": workers}, parse_override("train.batchnorm=local")
    )
    assert (
        build_trainer(validate_config(data), _loop, RunConfig()).setup().batch.batchnorm == "local"
    )
    with pytest.raises(Exception, match="batchnorm"):
        BatchConfig(global_batch_size=8, batchnorm="sync")
