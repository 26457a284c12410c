"""Memory-capped slices in count-weighted micro-batches, on a real 3-rank gloo group.

The update must stay the single-device update for the global batch (float64, <= 1e-10):
ranks whose slice exceeds their cap in samples per pass accumulate micro-batches under DDP's
``no_sync`` and synchronise once. Exact BatchNorm is refused; the probe measures real peaks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_group import run_gloo_group

import raytrain_hetero as rh
from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.errors import ConfigError, HeteroError, ProbeError
from raytrain_hetero.worker.data.micro_batches import split_batch
from raytrain_hetero.worker.measure.memory_probe import probe_memory
from raytrain_hetero.worker.measure.timing import StepInfo
from raytrain_hetero.worker.plan.calibration import measure_pass_caps
from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime, install_runtime
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

SLICES = (5, 2, 9)
#: Samples per pass by rank: rank 0 in parts 2+2+1, rank 1 whole, rank 2 in parts 3+3+3.
PASS_CAPS = (2, None, 4)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(sum(SLICES), 3, 5, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (sum(SLICES),), generator=g)
    return x, y


def _model(batchnorm: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 6, 3, padding=1)]
    if batchnorm:
        layers.append(torch.nn.BatchNorm2d(6))
    layers += [torch.nn.Tanh(), torch.nn.Flatten(), torch.nn.Linear(6 * 25, 4)]
    return torch.nn.Sequential(*layers).double()


def _install(rank: int, world_size: int, **setup: object) -> RankIdentity:
    caps = setup.pop("caps", PASS_CAPS)
    specs = tuple(WorkerSpec(name=f"w{i}", max_micro_batch=caps[i]) for i in range(world_size))
    batch = BatchConfig(global_batch_size=sum(SLICES), **setup)
    identity = RankIdentity(
        setup=HeteroSetup(run_id="t", specs=specs, batch=batch),
        slot=rank,
        rank=rank,
        world_size=world_size,
    )
    install_runtime(WorkerRuntime.start(identity))
    return identity


def _steps_by_mode(rank: int, world_size: int) -> dict[str, dict]:
    steps = {mode: _accumulated_step(rank, world_size, mode) for mode in ("accumulate", "slice")}
    # The seed papers' HDP baseline: every rank's slice-mean gradient counts the same.
    steps["uniform"] = _accumulated_step(rank, world_size, "slice", weighting="uniform")
    return steps


def _accumulated_step(rank: int, world_size: int, mode: str, weighting: str = "proportional"):
    """One training step through the public API: prepare_model, micro_batches, backward."""
    identity = _install(rank, world_size, memory_cap_mode=mode, weighting=weighting)
    runtime = get_runtime()
    model = rh.prepare_model(_model())
    # The real path: WorkerSpec.max_micro_batch gathered into every rank's pass caps.
    runtime.plans.pass_caps = measure_pass_caps(identity, model, None)
    calls = {"all_reduce": 0}
    real = dist.all_reduce

    def counted(*args, **kwargs):
        calls["all_reduce"] += 1
        return real(*args, **kwargs)

    dist.all_reduce = counted
    x, y = _data()
    start = sum(SLICES[:rank])
    batch = (x[start : start + SLICES[rank]], y[start : start + SLICES[rank]])
    runtime.timing.begin(StepInfo(0, 0, 0, SLICES, rank, 0))
    parts = []
    for part in rh.micro_batches(batch):
        parts.append((part.size, part.weight, part.data is batch))
        loss = torch.nn.functional.cross_entropy(model(part.data[0]), part.data[1])
        (loss * part.weight).backward()
    runtime.timing.end()
    dist.all_reduce = real
    grads = [p.grad.clone() for p in model.module.parameters()]
    return {"grads": grads, "parts": parts, "all_reduce": calls["all_reduce"]}


def _one_device_grads(part: slice = slice(None)) -> list[torch.Tensor]:
    model = _model()
    x, y = _data()
    torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
    return [p.grad for p in model.parameters()]


def _slice_of(rank: int) -> slice:
    start = sum(SLICES[:rank])
    return slice(start, start + SLICES[rank])


def _both(rank: int, world_size: int) -> dict[str, dict]:
    """Both group tests' figures from one group of processes (a spawn each)."""
    return {"steps": _steps_by_mode(rank, world_size), "prepare": _prepare(rank, world_size)}


@pytest.fixture(scope="module")
def group_results() -> dict[int, dict[str, dict]]:
    return run_gloo_group(_both, len(SLICES))


def test_accumulated_micro_batches_give_the_one_device_update(group_results):
    by_rank = {rank: both["steps"] for rank, both in group_results.items()}
    results = {rank: modes["accumulate"] for rank, modes in by_rank.items()}
    want = _one_device_grads()
    for result in results.values():
        for got, expected in zip(result["grads"], want):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    assert [size for size, _, _ in results[0]["parts"]] == [2, 2, 1]
    assert [size for size, _, _ in results[2]["parts"]] == [3, 3, 3]
    assert [w for _, w, _ in results[2]["parts"]] == pytest.approx([1 / 3] * 3)
    # A slice within its cap comes whole, weight 1: the plain loop's step.
    assert results[1]["parts"] == [(2, 1.0, True)]
    # The gradients crossed the group once per bucket, as without micro-batches.
    assert len({r["all_reduce"] for r in results.values()}) == 1
    # memory_cap_mode "slice": the allocation caps slices, the loop never splits them.
    for rank, modes in by_rank.items():
        assert modes["slice"]["parts"] == [(SLICES[rank], 1.0, True)]
        for got, expected in zip(modes["slice"]["grads"], want):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_uniform_weighting_averages_slice_means_and_is_clearly_not_exact(group_results):
    """``weighting: uniform`` (comparisons only) is what it says, and not the one-device step."""
    per_rank = [_one_device_grads(_slice_of(rank)) for rank in range(len(SLICES))]
    uniform = [sum(grads) / len(SLICES) for grads in zip(*per_rank)]
    exact = _one_device_grads()
    for both in group_results.values():
        got = both["steps"]["uniform"]["grads"]
        for g, u in zip(got, uniform):
            torch.testing.assert_close(g, u, rtol=1e-10, atol=1e-10)
        error = max(float((g - e).norm() / e.norm()) for g, e in zip(got, exact))
        assert error > 1e-2, error


CASES = (("exact", "accumulate"), ("local", "accumulate"), ("exact", "slice"))


def _prepare(rank: int, world_size: int) -> dict[tuple[str, str], str]:
    outcome = {}
    for batchnorm, mode in CASES:
        _install(rank, world_size, batchnorm=batchnorm, memory_cap_mode=mode)
        try:
            rh.prepare_model(_model(batchnorm=True))
            outcome[batchnorm, mode] = "accepted"
        except ConfigError as exc:
            outcome[batchnorm, mode] = str(exc)
    return outcome


def test_exact_batchnorm_refused_with_accumulation_only(group_results):
    by_rank = {rank: both["prepare"] for rank, both in group_results.items()}
    refused = by_rank[0]["exact", "accumulate"]
    assert "batchnorm: local" in refused and "memory_cap_mode: slice" in refused
    # Every rank decides alike: nobody waits in a collective.
    assert by_rank[0] == by_rank[1] == by_rank[2]
    assert by_rank[0]["local", "accumulate"] == by_rank[0]["exact", "slice"] == "accepted"


def test_split_batch_walks_structures():
    batch = {"image": torch.arange(10).reshape(5, 2), "label": torch.arange(5), "name": "x"}
    parts = split_batch(batch, [3, 2])
    assert [p["label"].tolist() for p in parts] == [[0, 1, 2], [3, 4]]
    assert parts[1]["image"].tolist() == [[6, 7], [8, 9]] and parts[1]["name"] == "x"
    with pytest.raises(HeteroError, match="first dimension"):
        split_batch(torch.zeros(4, 2), [3, 2])


def _make_batch(size: int) -> torch.Tensor:
    return torch.randn(size, 13, 48, 48)


def _conv() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(13, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def test_memory_probe_measures_real_peaks_and_caps_by_the_budget():
    model = _conv()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def probe(memory: float | None, fraction: float = 1.0, ranks_on_node: int = 1):
        return probe_memory(
            model,
            _make_batch,
            (8, 24),
            device="cpu",
            loss_fn=lambda m, b: m(b).mean(),
            fraction=fraction,
            ray_memory_bytes=memory,
            ranks_on_node=ranks_on_node,
        )

    roomy = probe(64 * 2**30)
    if roomy is None:
        pytest.skip("this system cannot reset the resident-set peak (/proc/self/clear_refs)")
    # Activations kept for backward: two 32-channel 48x48 float maps and more, per sample.
    assert roomy.model.per_sample_bytes > 2 * 32 * 48 * 48 * 4 * 0.5
    assert roomy.cap is not None and roomy.cap > 24
    half = probe(64 * 2**30, fraction=0.5)
    assert half.cap < roomy.cap
    # Without a Ray memory resource, the node's available RAM is shared by its workers.
    alone, shared = probe(None, 0.5), probe(None, 0.5, ranks_on_node=8)
    assert shared.budget_bytes == pytest.approx(alone.budget_bytes / 8, rel=0.2)
    with pytest.raises(ProbeError, match="Not even one sample fits"):
        probe(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
