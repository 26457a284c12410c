"""Branch placement on real gloo groups of 2 and 3 processes (no Ray): exact against one device.

Each spawned rank builds the same seeded model twice: one copy is split by a
:class:`BranchPipeline`, the other trains on one device as the reference. Per scenario (dtype,
micro-batches, head rank, model) the rank records the largest error of the output, the loss,
every parameter gradient it owns (first step), the whole unsplit state_dict gathered by
``full_state_dict`` after several SGD-with-momentum steps (the trajectory; BatchNorm running
statistics included) and the eval-mode prediction; the tests assert on those records.
Dropout in the head draws from the head rank's RNG, seeded like the reference before each step.

Errors are ``max |got - want| / max(1, max |want|)``: float64 <= 1e-10, float32 <= 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from gloo_group import run_gloo_group
from torch import nn

from raytrain_hetero.core.branch_placement import BranchPlacement, place_branches
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel import (
    BranchPipeline,
    branch_model_of,
    data_parallel_bytes_per_step,
    micro_batch_sizes,
    plan_branch_placement,
    predicted_branch_bytes_per_step,
)
from raytrain_hetero.workloads.models import SmallCNN, TwoBranchFusionCNN

BATCH = 10
STEPS = 3
S1, S2, CLASSES = 2, 10, 7
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


class PlainTwoBranch(nn.Module):
    """Two branches without BatchNorm (so training micro-batches them), dropout in the head."""

    def __init__(self) -> None:
        super().__init__()
        self.sar = nn.Sequential(
            nn.Conv2d(S1, 3, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.msi = nn.Sequential(
            nn.Conv2d(S2, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        )
        self.head = nn.Sequential(
            nn.Linear(3 + 16, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, CLASSES)
        )

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :S1], x[:, S1:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self._split(x)
        return self.head(torch.cat([self.sar(a), self.msi(b)], dim=1))

    # Declares its branches (parallel.DeclaresBranches) without importing the package.
    def branch_modules(self) -> tuple[tuple[str, nn.Module], ...]:
        return (("sar", self.sar), ("msi", self.msi))

    def fusion_head(self) -> nn.Module:
        return self.head

    def split_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._split(x)


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str  # "fusion" (TwoBranchFusionCNN, BatchNorm in branches) or "plain"
    dtype: torch.dtype
    micro: int | tuple[int, ...]
    branch_ranks: dict[str, int] = field(hash=False)
    head_rank: int


def _scenarios(world: int) -> list[Scenario]:
    out = []
    if world == 2:
        for dtype in (torch.float64, torch.float32):
            for micro in (1, 3, (1, 4, 5)):
                for head in (0, 1):
                    tag = f"fusion-{str(dtype)[6:]}-m{micro}-head{head}".replace(" ", "")
                    out.append(Scenario(tag, "fusion", dtype, micro, {"s1": 0, "s2": 1}, head))
        for micro in (4, (1, 4, 5)):
            for head in (0, 1):
                tag = f"plain-float64-m{micro}-head{head}".replace(" ", "")
                out.append(Scenario(tag, "plain", torch.float64, micro, {"sar": 1, "msi": 0}, head))
        out.append(
            Scenario("plain-float32-m3-head1", "plain", torch.float32, 3, {"sar": 0, "msi": 1}, 1)
        )
    else:  # 3 ranks: each branch on its own rank, the head on a third
        for dtype in (torch.float64, torch.float32):
            tag = f"fusion-{str(dtype)[6:]}-m2-headalone"
            out.append(Scenario(tag, "fusion", dtype, 2, {"s1": 0, "s2": 1}, 2))
        out.append(
            Scenario(
                "plain-float64-m3-headalone", "plain", torch.float64, 3, {"sar": 2, "msi": 0}, 1
            )
        )
    return out


def _model(kind: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    model = TwoBranchFusionCNN(S1, S2, CLASSES, width=4) if kind == "fusion" else PlainTwoBranch()
    return model.to(dtype)


def _batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + step)
    x = torch.randn(BATCH, S1 + S2, 12, 12, generator=g, dtype=torch.float64)
    return x.to(dtype), torch.randint(0, CLASSES, (BATCH,), generator=g)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.dtype in (torch.int64, torch.long):
        return float((got != want).any())
    want = want.detach().double()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    return float((got.detach().double() - want).abs().max()) / scale if want.numel() else 0.0


def _run(sc: Scenario, rank: int, world: int) -> dict:
    loss_fn = nn.CrossEntropyLoss()
    ref = _model(sc.model, sc.dtype)
    split = _model(sc.model, sc.dtype)
    names = branch_model_of(ref).branch_names
    placement = BranchPlacement.explicit(sc.branch_ranks, names, sc.head_rank, world)
    pipe = BranchPipeline(split, placement, rank=rank, micro_batches=sc.micro)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    ref_params = dict(ref.named_parameters())
    rec = {"output": 0.0, "loss": 0.0, "grad": 0.0, "owned": 0, "state": 0.0, "predict": 0.0}
    for step in range(STEPS):
        x, y = _batch(step, sc.dtype)
        if step == 0:
            rec["predicted_bytes"] = predicted_branch_bytes_per_step(ref, placement, x, sc.micro)
        torch.manual_seed(100 + step)
        ref_opt.zero_grad()
        ref_out = ref(x)
        ref_loss = loss_fn(ref_out, y)
        ref_loss.backward()
        torch.manual_seed(100 + step)
        opt.zero_grad()
        result = pipe.forward_backward(x, y if rank == sc.head_rank else None, loss_fn)
        rec["loss"] = max(
            rec["loss"], _err(torch.tensor(result.loss, dtype=torch.float64), ref_loss)
        )
        if rank == sc.head_rank:
            rec["output"] = max(rec["output"], _err(result.output, ref_out))
        if step == 0:
            rec["bytes_sent"] = result.bytes_sent
            rec["bytes_received"] = result.bytes_received
            for name, param in split.named_parameters():
                if param.device.type == "meta":
                    continue
                rec["owned"] += 1
                rec["grad"] = max(rec["grad"], _err(param.grad, ref_params[name].grad))
        opt.step()
        ref_opt.step()
    full = pipe.full_state_dict()
    want = ref.state_dict()
    rec["same_keys"] = list(full) == list(want)
    rec["state"] = max(_err(full[k], want[k]) for k in want)
    # A fresh pipeline with the other placement resumes from the gathered state_dict.
    other = BranchPlacement.explicit(
        {n: (r + 1) % world for n, r in sc.branch_ranks.items()},
        names,
        (sc.head_rank + 1) % world,
        world,
    )
    resumed = BranchPipeline(_model(sc.model, sc.dtype), other, rank=rank, micro_batches=sc.micro)
    resumed.load_full_state_dict(full)
    resumed.eval()
    ref.eval()
    x, _ = _batch(STEPS, sc.dtype)
    got = resumed.predict(x)
    if rank == other.head_rank:
        rec["predict"] = _err(got, ref(x))
    rec["predict_none_elsewhere"] = (got is None) == (rank != other.head_rank)
    return rec


def _errors(rank: int, world: int) -> dict[str, str]:
    messages = {}
    model = _model("fusion", torch.float64)
    wrong_world = BranchPlacement.explicit({"s1": 0, "s2": 1}, ("s1", "s2"), 2, 3)
    for key, call in {
        "wrong_world": lambda: BranchPipeline(model, wrong_world, rank=rank),
        "no_branches": lambda: BranchPipeline(SmallCNN(3, 2, 4), wrong_world, rank=rank),
        "foreign_placement": lambda: BranchPipeline(
            model, BranchPlacement.explicit({"a": 0, "b": 1}, ("a", "b"), 0, world), rank=rank
        ),
    }.items():
        try:
            call()
        except ModelParallelError as exc:
            messages[key] = str(exc)
    return messages


def _measured_placement(rank: int) -> BranchPlacement:
    """Placement from costs measured on each rank, rank 1 emulated 4x slower."""
    model = TwoBranchFusionCNN(S1, S2, CLASSES, width=8).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, _ = _batch(0, torch.float64)
    rng = torch.get_rng_state()
    placement = plan_branch_placement(model, x, repeats=2, slowdown=(1.0, 4.0)[rank])
    assert torch.equal(torch.get_rng_state(), rng), "measuring moved the RNG"
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "measuring changed the model"
    return placement


def _rank_main(rank: int, world: int) -> dict:
    payload = {sc.name: _run(sc, rank, world) for sc in _scenarios(world)}
    payload["errors"] = _errors(rank, world) if world == 2 else {}
    payload["measured"] = _measured_placement(rank) if world == 2 else None
    return payload


@pytest.fixture(scope="module")
def two_ranks() -> dict[int, dict]:
    return run_gloo_group(_rank_main, 2)


@pytest.fixture(scope="module")
def three_ranks() -> dict[int, dict]:
    return run_gloo_group(_rank_main, 3)


def _check(results: dict[int, dict], sc: Scenario) -> None:
    tol = TOLERANCE[sc.dtype]
    recs = [results[r][sc.name] for r in sorted(results)]
    for rank, rec in enumerate(recs):
        for key in ("output", "loss", "grad", "state", "predict"):
            assert rec[key] <= tol, f"rank {rank} {key} error {rec[key]:.3g} > {tol}"
        assert rec["same_keys"], f"rank {rank}: full_state_dict keys differ from the model's"
        assert rec["predict_none_elsewhere"]
    # Every parameter is owned by exactly one rank.
    n_params = len(list(_model(sc.model, sc.dtype).parameters()))
    assert sum(rec["owned"] for rec in recs) == n_params
    # Measured traffic equals the prediction, and what is sent is what is received.
    sent = sum(rec["bytes_sent"] for rec in recs)
    assert sent == recs[0]["predicted_bytes"] == sum(rec["bytes_received"] for rec in recs)


@pytest.mark.parametrize("sc", _scenarios(2), ids=lambda s: s.name)
def test_two_ranks_exact_against_one_device(two_ranks, sc):
    _check(two_ranks, sc)


@pytest.mark.parametrize("sc", _scenarios(3), ids=lambda s: s.name)
def test_three_ranks_head_on_its_own_rank_exact(three_ranks, sc):
    _check(three_ranks, sc)


def test_pipeline_errors_name_the_problem(two_ranks):
    for rank in (0, 1):
        errors = two_ranks[rank]["errors"]
        assert "placement is for 3 rank(s)" in errors["wrong_world"]
        assert "SmallCNN does not declare its branches" in errors["no_branches"]
        assert "unknown: ['a', 'b']" in errors["foreign_placement"]


def test_measured_placement_is_agreed_by_every_rank(two_ranks):
    placements = [two_ranks[r]["measured"] for r in (0, 1)]
    assert placements[0] == placements[1]
    placement = placements[0]
    assert placement.world_size == 2 and sorted(placement.branch_names) == ["s1", "s2"]
    assert len(placement.stage_times) == 2 and all(t > 0 for t in placement.stage_times)


def test_branch_placement_moves_fewer_bytes_than_data_parallel():
    model = TwoBranchFusionCNN(S1, S2, CLASSES, width=32)
    x = torch.zeros(64, S1 + S2, 32, 32)
    placement = BranchPlacement.explicit({"s1": 0, "s2": 1}, ("s1", "s2"), 0, 2)
    branch = predicted_branch_bytes_per_step(model, placement, x, 4)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert data_parallel_bytes_per_step(model, 2) == 2 * params
    # s2's 64-float embedding per sample, forward and back, plus 4 headers and the loss.
    assert branch == 64 * 64 * 4 * 2 + 4 * 64 + 8
    assert branch < data_parallel_bytes_per_step(model, 2)


def test_declared_branches_compute_the_model_exactly():
    model = _model("fusion", torch.float64).eval()
    x, _ = _batch(0, torch.float64)
    declared = branch_model_of(model)
    assert declared.branch_names == ("s1", "s2")
    assert declared.branches[1][1] is model.branches["s2"] and declared.head is model.head
    assert torch.equal(declared.forward(x), model(x))
    assert branch_model_of(declared) is declared  # a BranchModel is taken as it is
    single = TwoBranchFusionCNN(S1, S2, CLASSES, width=4, modalities=("s2",))
    assert branch_model_of(single).branch_names == ("s2",)


class NotModules(PlainTwoBranch):
    def fusion_head(self) -> nn.Module:
        return "head"  # type: ignore[return-value]


def test_model_without_declared_branches_is_refused():
    with pytest.raises(ModelParallelError, match="does not declare its branches") as refused:
        branch_model_of(SmallCNN(3, 2, 4))
    assert "raytrain_hetero.parallel.BranchModel" in str(refused.value)
    with pytest.raises(ModelParallelError, match=r"fusion_head\(\) an nn.Module"):
        branch_model_of(NotModules())


def test_placement_errors():
    names = ("s1", "s2")
    with pytest.raises(ModelParallelError, match="unknown branch"):
        BranchPlacement.explicit({"s1": 0, "s2": 1, "s3": 0}, names, 0, 2)
    with pytest.raises(ModelParallelError, match=r"leaves branch\(es\) \['s2'\]"):
        BranchPlacement.explicit({"s1": 0}, names, 0, 2)
    with pytest.raises(ModelParallelError, match="ranks 0..1"):
        BranchPlacement.explicit({"s1": 0, "s2": 2}, names, 0, 2)
    with pytest.raises(ModelParallelError, match="would hold no branch"):
        BranchPlacement.explicit({"s1": 0, "s2": 0}, names, 0, 2)
    with pytest.raises(ModelParallelError, match="rank\\(s\\) would be idle"):
        place_branches(names, [[1.0, 1.0]] * 4)
    with pytest.raises(ModelParallelError, match="unknown branch 'x'"):
        BranchPlacement.explicit({"s1": 0, "s2": 1}, names, 0, 2).rank_of("x")


def test_micro_batch_sizes():
    assert micro_batch_sizes(10, 3) == (4, 3, 3)
    assert micro_batch_sizes(2, 5) == (1, 1)
    assert micro_batch_sizes(10, (1, 4, 5)) == (1, 4, 5)
    with pytest.raises(ModelParallelError, match="sum to the batch size 10"):
        micro_batch_sizes(10, (1, 4))
    with pytest.raises(ModelParallelError, match=">= 1"):
        micro_batch_sizes(10, 0)
