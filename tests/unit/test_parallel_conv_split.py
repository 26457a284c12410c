"""Conv split over real gloo process groups equals the single-device model.

Three ranks (spawned processes, gloo on 127.0.0.1) split two conv layers unevenly (5 kernels
as 1, 1, 3; 7 kernels from per-kernel costs), with BatchNorm after a split conv. Each rank also
builds the plain model from the same seed and runs it on the same batches, so every comparison
is against one device: outputs, the input gradient, every parameter gradient (split layers'
blocks gathered), several optimizer steps (SGD with momentum, Adam) and a re-split mid-training,
full-state round trips in both directions, and the errors. Each rank reports figures; the test
asserts on them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from gloo_group import run_gloo_group
from torch import nn

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel.conv_split import (
    SplitConv2d,
    all_gather_blocks,
    check_replicas_identical,
    split_conv_layers,
    split_layers,
)
from raytrain_hetero.parallel.conv_state import (
    full_optimizer_state_dict,
    full_state_dict,
    gather_kernel_costs,
    load_full_optimizer_state_dict,
    load_full_state_dict,
    probe_kernel_cost,
    resplit,
)

RANKS = 3
FIRST_SPLIT = {"conv1": (1, 1, 3)}
# Per-kernel costs of conv2 on each rank: rank 2 fastest, rank 1 slowest.
CONV2_COSTS = [CostModel(0.0, 1.0), CostModel(0.0, 2.0), CostModel(0.0, 0.5)]
RESPLIT = {"conv1": (3, 1, 1), "conv2": (1, 5, 1)}
STEPS_BEFORE, STEPS_AFTER = 3, 3


class Net(nn.Module):
    """Two conv layers (the first followed by BatchNorm), pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        # No bias before BatchNorm: its exact gradient is 0, and Adam would turn the float
        # noise around 0 into full-size steps of either sign.
        self.conv1 = nn.Conv2d(3, 5, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(5)
        self.conv2 = nn.Conv2d(5, 7, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.head = nn.Linear(28, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.bn1(self.conv1(x)))
        x = torch.tanh(self.conv2(x))
        return self.head(self.pool(x).flatten(1))


def _batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(6, 3, 8, 8, generator=gen, dtype=torch.float64).to(dtype)
    target = torch.randint(0, 3, (6,), generator=gen)
    return x, target


def _loss(model: nn.Module, step: int, dtype: torch.dtype) -> torch.Tensor:
    x, target = _batch(step, dtype)
    return nn.functional.cross_entropy(model(x), target)


def _full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by name, split layers' blocks gathered."""
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for name, layer in split_layers(model):
        for attr in ("weight", "bias"):
            param = getattr(layer, attr)
            if param is not None:
                grads[f"{name}.{attr}"] = all_gather_blocks(
                    param.grad, layer.kernels_per_rank, 0, layer.group
                )
    return grads


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _spread(tensors: list[torch.Tensor]) -> float:
    """max over elements of (max over ranks - min over ranks)."""
    flat = torch.cat([t.reshape(-1).double() for t in tensors])
    both = torch.cat([flat, -flat])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return float((both[: flat.numel()] + both[flat.numel() :]).max())


def _error(call) -> str:
    try:
        call()
    except ModelParallelError as error:
        return str(error)
    return "no error"


def _train(model: nn.Module, optimizer, steps: range, dtype: torch.dtype) -> torch.Tensor:
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(model, step, dtype)
        loss.backward()
        optimizer.step()
    return loss  # its graph (and the parameters' gradient accumulators) stays alive


def _optimizer(name: str, model: nn.Module):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=0.01)


def _scenarios(rank: int, dtype: torch.dtype) -> dict[str, object]:
    figures: dict[str, object] = {}
    torch.manual_seed(0)
    plain = Net().to(dtype)
    split = copy.deepcopy(plain)
    splits = split_conv_layers(
        split, ["conv1", "conv2"], kernels_per_rank=FIRST_SPLIT, costs={"conv2": CONV2_COSTS}
    )
    figures["splits"] = splits
    figures["local_kernels"] = split.conv1.weight.shape[0]

    # One forward/backward against one device, input gradient included.
    x, target = _batch(0, dtype)
    x_plain, x_split = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain, out_split = plain(x_plain), split(x_split)
    nn.functional.cross_entropy(out_plain, target).backward()
    nn.functional.cross_entropy(out_split, target).backward()
    figures["output"] = float((out_plain - out_split).detach().abs().max())
    figures["input_grad"] = float((x_plain.grad - x_split.grad).abs().max())
    figures["param_grads"] = _max_diff(
        {n: p.grad for n, p in plain.named_parameters()}, _full_grads(split)
    )
    replicated = [p.grad for n, p in split.named_parameters() if not n.startswith("conv")]
    figures["replicated_grad_spread"] = _spread(replicated)
    figures["running_stats"] = float((plain.bn1.running_var - split.bn1.running_var).abs().max())

    # Training with a re-split in the middle vs never re-splitting vs one device.
    for opt_name in ("sgd", "adam"):
        torch.manual_seed(1)
        base = Net().to(dtype)
        never, moved = copy.deepcopy(base), copy.deepcopy(base)
        for model in (never, moved):
            split_conv_layers(model, ["conv1", "conv2"], kernels_per_rank=FIRST_SPLIT)
        opt_base, opt_never, opt_moved = (_optimizer(opt_name, m) for m in (base, never, moved))
        _train(base, opt_base, range(STEPS_BEFORE), dtype)
        _train(never, opt_never, range(STEPS_BEFORE), dtype)
        last_loss = _train(moved, opt_moved, range(STEPS_BEFORE), dtype)
        resplit(moved, opt_moved, RESPLIT)  # while the last step's graph is still referenced
        after = range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER)
        _train(base, opt_base, after, dtype)
        _train(never, opt_never, after, dtype)
        _train(moved, opt_moved, after, dtype)
        del last_loss
        figures[f"{opt_name}_moved_kernels"] = moved.conv2.kernels_per_rank
        figures[f"{opt_name}_moved_local"] = tuple(moved.conv2.weight.shape)
        full_moved = full_state_dict(moved)
        figures[f"{opt_name}_vs_one_device"] = _max_diff(dict(base.state_dict()), full_moved)
        figures[f"{opt_name}_vs_never_resplit"] = _max_diff(full_state_dict(never), full_moved)
        figures[f"{opt_name}_replicas"] = check_replicas_identical(moved)

        # Conv split -> data parallel (plain model) resume: same next step.
        resumed = Net().to(dtype)
        resumed.load_state_dict(full_moved)
        opt_resumed = _optimizer(opt_name, resumed)
        opt_resumed.load_state_dict(full_optimizer_state_dict(moved, opt_moved))
        # Plain -> conv split resume, into a third split.
        back = Net().to(dtype)
        split_conv_layers(back, ["conv1", "conv2"], check=False)
        load_full_state_dict(back, base.state_dict())
        opt_back = _optimizer(opt_name, back)
        load_full_optimizer_state_dict(back, opt_back, opt_base.state_dict())
        final = range(STEPS_BEFORE + STEPS_AFTER, STEPS_BEFORE + STEPS_AFTER + 2)
        for model, opt in ((base, opt_base), (resumed, opt_resumed), (back, opt_back)):
            _train(model, opt, final, dtype)
        figures[f"{opt_name}_split_to_plain_resume"] = _max_diff(
            dict(base.state_dict()), dict(resumed.state_dict())
        )
        figures[f"{opt_name}_plain_to_split_resume"] = _max_diff(
            dict(base.state_dict()), full_state_dict(back)
        )

    # Errors (raised before any collective, the same on every rank).
    grouped = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2), nn.ReLU(), nn.Conv2d(4, 2, 1))
    figures["error_grouped"] = _error(lambda: split_conv_layers(grouped, ["0"]))
    figures["error_narrow"] = _error(lambda: split_conv_layers(grouped, ["2"]))
    figures["error_missing"] = _error(lambda: split_conv_layers(grouped, ["conv9"]))
    figures["error_not_conv"] = _error(lambda: split_conv_layers(grouped, ["1"]))
    figures["error_twice"] = _error(lambda: split_conv_layers(split, ["conv1"]))
    figures["error_bad_split"] = _error(
        lambda: SplitConv2d(nn.Conv2d(3, 5, 1), (1, 1, 1), rank=rank)
    )
    figures["error_resplit"] = _error(lambda: resplit(split, None, {"conv1": (0, 2, 3)}))
    differing = Net().to(dtype)
    with torch.no_grad():
        differing.head.bias.add_(rank)
    figures["error_replicas_differ"] = _error(lambda: split_conv_layers(differing, ["conv1"]))

    # Exact-size gather over a subgroup (group ranks are not global ranks) and its bytes.
    if dtype == torch.float64:
        pair = dist.new_group([1, 2])  # a collective: every rank creates it
        if rank in (1, 2):
            sizes = (2, 5)
            full = torch.arange(6 * 7 * 4, dtype=dtype).reshape(6, 7, 4)
            mine = full[:, :2] if rank == 1 else full[:, 2:]
            gathered = all_gather_blocks(mine, sizes, 1, pair)
            figures["subgroup_gather_exact"] = bool(torch.equal(gathered, full))
            figures["error_gather_size"] = _error(
                lambda: all_gather_blocks(full[:, :3], sizes, 1, pair)
            )
        figures["gather_bytes"] = split.conv1.gather_bytes((6, 3, 8, 8), 4)
        # Per-kernel cost probe through the emulator: rank r is emulated (r + 1)^2 times slower.
    if dtype == torch.float32:
        conv = nn.Conv2d(16, 64, 3, padding=1)
        cost = probe_kernel_cost(conv, (8, 16, 16, 16), slowdown=(rank + 1) ** 2, repeats=3)
        costs = gather_kernel_costs(cost)
        figures["probed_betas"] = tuple(c.beta for c in costs)
        big = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1))
        figures["probed_split"] = split_conv_layers(big, ["0"], costs={"0": costs})["0"]
    return figures


def _rank_main(rank: int, world_size: int) -> dict[str, dict[str, object]]:
    return {str(dtype): _scenarios(rank, dtype) for dtype in (torch.float64, torch.float32)}


@pytest.fixture(scope="module")
def rank_figures() -> dict[int, dict[str, dict[str, object]]]:
    """Figures of every rank, by dtype: one group of processes runs both dtypes."""
    return run_gloo_group(_rank_main, RANKS)


@pytest.mark.parametrize(
    ("dtype", "tolerance", "trajectory_tolerance"),
    [(torch.float64, 1e-10, 1e-10), (torch.float32, 1e-5, 1e-4)],
    ids=["float64", "float32"],
)
def test_conv_split_equals_one_device(rank_figures, dtype, tolerance, trajectory_tolerance):
    results = {rank: figures[str(dtype)] for rank, figures in rank_figures.items()}
    assert sorted(results) == list(range(RANKS))
    for rank, f in results.items():
        # conv1 as given (uneven 1, 1, 3); conv2 from costs 1, 2, 0.5 per kernel.
        assert f["splits"] == {"conv1": (1, 1, 3), "conv2": (2, 1, 4)}, rank
        assert f["local_kernels"] == FIRST_SPLIT["conv1"][rank]
        assert f["output"] <= tolerance, (rank, f["output"])
        assert f["input_grad"] <= tolerance, (rank, f["input_grad"])
        assert f["param_grads"] <= tolerance, (rank, f["param_grads"])
        assert f["running_stats"] <= tolerance, (rank, f["running_stats"])
        # Replicated layers: bitwise the same gradient on every rank, with no all-reduce.
        assert f["replicated_grad_spread"] == 0.0
        for opt in ("sgd", "adam"):
            assert f[f"{opt}_moved_kernels"] == RESPLIT["conv2"]
            assert f[f"{opt}_moved_local"] == (RESPLIT["conv2"][rank], 5, 3, 3)
            assert f[f"{opt}_vs_one_device"] <= trajectory_tolerance, (opt, rank, f)
            assert f[f"{opt}_vs_never_resplit"] <= trajectory_tolerance, (opt, rank, f)
            assert f[f"{opt}_replicas"] == 0.0
            assert f[f"{opt}_split_to_plain_resume"] <= trajectory_tolerance, (opt, rank, f)
            assert f[f"{opt}_plain_to_split_resume"] <= trajectory_tolerance, (opt, rank, f)
        assert "grouped or depthwise" in f["error_grouped"]
        assert "at least one kernel" in f["error_narrow"]
        assert "not found" in f["error_missing"]
        assert "not an nn.Conv2d" in f["error_not_conv"]
        assert "already split" in f["error_twice"]
        assert "sum to 3" in f["error_bad_split"]
        assert ">= 1 kernel" in f["error_resplit"]
        assert "differ between ranks" in f["error_replicas_differ"]
    if dtype == torch.float32:
        betas = results[0]["probed_betas"]
        assert all(results[r]["probed_betas"] == betas for r in results)
        # Emulated 1x, 4x, 9x slower: the probe sees it, and the split follows the speeds
        # (how far depends on the fitted fixed costs, which a loaded machine inflates).
        assert betas[0] < betas[1] < betas[2], betas
        split = results[0]["probed_split"]
        assert sum(split) == 64 and min(split) >= 1
        assert split[0] >= split[1] >= split[2] and split[0] > split[2], split


def test_gather_moves_each_block_at_its_own_size(rank_figures):
    figures = {rank: f[str(torch.float64)] for rank, f in rank_figures.items()}
    for rank in (1, 2):
        assert figures[rank]["subgroup_gather_exact"] is True
        assert "every rank must pass the same sizes" in figures[rank]["error_gather_size"]
    # conv1 split (1, 1, 3), output 6 x 8 x 8 float32 per channel = 1536 bytes: each rank
    # sends its own block to the 2 others and receives the rest; nothing is padded.
    channel = 6 * 8 * 8 * 4
    assert figures[0]["gather_bytes"] == (2 * 1 * channel, 4 * channel)
    assert figures[1]["gather_bytes"] == (2 * 1 * channel, 4 * channel)
    assert figures[2]["gather_bytes"] == (2 * 3 * channel, 2 * channel)
    sent = sum(f["gather_bytes"][0] for f in figures.values())
    assert sent == sum(f["gather_bytes"][1] for f in figures.values()) == 2 * 5 * channel


def test_package_exports_lazily():
    import subprocess
    import sys

    import raytrain_hetero.parallel as parallel

    assert parallel.SplitConv2d is SplitConv2d and parallel.resplit is resplit
    assert set(parallel.__all__) <= set(dir(parallel))
    code = "import sys, raytrain_hetero.parallel; assert 'torch' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
