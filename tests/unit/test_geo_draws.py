"""torchgeo's geo samplers under the carving, on GeoTIFFs in torchgeo's L7Irish layout (no Ray).

The draws of a ``RandomGeoSampler`` (single ``RasterDataset``), a ``RandomBatchGeoSampler``
(``L7IrishDataModule``: an ``IntersectionDataset`` of image and mask rasters) and a
``GridGeoSampler`` are listed per epoch by :class:`EpochDraws` and carved by the real
:class:`CarvingBatchSampler`: fixed by (seed, epoch), ``length`` draws per epoch, each draw
to exactly one rank under plan switches, the same queries after a mid-epoch resume; probes
read the sampler's draws; construction errors of the CLI are one line, exit 2, nothing written.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchgeo.datamodules import L7IrishDataModule
from torchgeo.datasets import stack_samples
from torchgeo.datasets.l7irish import L7IrishImage
from torchgeo.samplers import GridGeoSampler, RandomGeoSampler

from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.errors import DataError
from raytrain_hetero.worker.data.sampler import CarvingBatchSampler, EpochDraws
from raytrain_hetero.worker.lightning import geo_draws
from raytrain_hetero.workloads.synthetic.hyperspectral import generate_hyperspectral_scene

BATCH, LENGTH = 10, 47  # 4 full steps and a short one of 7 per epoch
SHARES, SWITCHED = (5.0, 3.0, 2.0), (2.0, 3.0, 5.0)


@pytest.fixture(scope="module")
def l7irish(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("l7irish")
    return generate_hyperspectral_scene(
        root, height=48, width=48, bands=9, classes=4, file_format="l7irish", region_size=8
    )


def _key(query) -> tuple:
    return tuple((s.start, s.stop) for s in query)


def _schedule(switch_at: int) -> PlanSchedule:
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(BATCH, SHARES))
    schedule.add(Plan.from_shares(BATCH, SWITCHED, version=2, effective_step=switch_at))
    return schedule


def test_random_draws_are_fixed_by_seed_and_epoch(l7irish):
    image = L7IrishImage(paths=str(l7irish))
    sampler = RandomGeoSampler(image, size=16, length=LENGTH)
    draws = EpochDraws(image, sampler, seed=3)
    before = torch.random.get_rng_state()
    first = [_key(q) for q in draws.queries(0)]
    assert torch.equal(torch.random.get_rng_state(), before)  # the global generator untouched
    assert len(draws) == len(first) == LENGTH
    again = EpochDraws(image, RandomGeoSampler(image, size=16, length=LENGTH), seed=3)
    assert [_key(q) for q in again.queries(0)] == first  # every rank lists the same draws
    assert [_key(q) for q in again.queries(1)] != first  # and new ones every epoch
    assert [_key(q) for q in EpochDraws(image, sampler, seed=4).queries(0)] != first
    # Position i reads epoch 0's draw i (what probes and calibration draw from).
    assert torch.equal(draws[5]["image"], image[draws.queries(0)[5]]["image"])
    assert draws[5]["image"].shape == (9, 16, 16)


def test_every_draw_goes_to_exactly_one_rank_under_a_plan_switch_and_resume(l7irish):
    image = L7IrishImage(paths=str(l7irish))
    draws = EpochDraws(image, RandomGeoSampler(image, size=16, length=LENGTH), seed=3)
    carver = EpochCarver(LENGTH, BATCH, seed=3, min_step_size=3)
    schedule = _schedule(switch_at=7)  # epoch 1, step 2
    samplers = [CarvingBatchSampler(carver, schedule, r, draws=draws.queries) for r in range(3)]
    for epoch in (0, 1):
        per_rank = []
        for sampler in samplers:
            sampler.set_position(epoch, 0)
            per_rank.append(list(sampler))
        # Every draw of the epoch exactly once across the ranks: the datamodule's `length`.
        taken = Counter(_key(q) for steps in per_rank for step in steps for q in step)
        assert taken == Counter(_key(q) for q in draws.queries(epoch))
        assert sum(taken.values()) == LENGTH
        for k in range(carver.steps_per_epoch):
            plan = schedule.plan_for(epoch * carver.steps_per_epoch + k)
            assert [len(steps[k]) for steps in per_rank] == list(carver.step_counts(k, plan)), (
                epoch,
                k,
            )
        # Epoch 1 switches at its third step; the short last step (7) is split by the plan too.
        assert [len(s[0]) for s in per_rank] == [5, 3, 2]
        assert [len(s[-1]) for s in per_rank] == ([1, 2, 4] if epoch else [4, 2, 1])
    # A restarted rank resumes mid-epoch at its cursor with the very same queries.
    resumed = CarvingBatchSampler(carver, schedule, 2, draws=draws.queries)
    resumed.set_position(1, 3)
    samplers[2].set_position(1, 0)
    assert [[_key(q) for q in s] for s in resumed] == [
        [_key(q) for q in s] for s in list(samplers[2])[3:]
    ]


def test_batch_sampler_of_an_intersection_datamodule_draws_exactly_length(l7irish):
    dm = L7IrishDataModule(paths=str(l7irish), batch_size=4, patch_size=16, length=LENGTH)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=0)
    assert draws is not None and len(dm.train_dataloader()) * 4 < LENGTH  # 11 batches of 4
    assert len(draws.queries(0)) == LENGTH
    carver = EpochCarver(LENGTH, BATCH, seed=0, min_step_size=3)
    sampler = CarvingBatchSampler(carver, _schedule(switch_at=99), 1, draws=draws.queries)
    loader = DataLoader(draws.dataset, batch_sampler=sampler, collate_fn=stack_samples)
    batch = next(iter(loader))
    assert batch["image"].shape == (3, 9, 16, 16) and batch["mask"].shape == (3, 16, 16)
    assert int(batch["mask"].max()) <= 4  # L7Irish's ordinal classes, read by torchgeo
    # Validation keeps torchgeo's GridGeoSampler; a map-style loader is not a geo one.
    assert geo_draws(dm.val_dataloader(), seed=0) is not None
    assert geo_draws(DataLoader(list(range(4))), seed=0) is None


def test_grid_cells_are_carved_like_indices(l7irish):
    image = L7IrishImage(paths=str(l7irish))
    grid = GridGeoSampler(image, size=16, stride=16)
    draws = EpochDraws(image, grid, seed=0)
    cells = [_key(q) for q in grid]
    assert len(draws) == len(cells) and [_key(q) for q in draws.queries(3)] == cells
    with pytest.raises(DataError, match="no samples"):
        EpochDraws(image, GridGeoSampler(image, size=4000), seed=0)


def test_probe_batches_are_drawn_through_the_sampler(l7irish):
    from raytrain_hetero.worker.measure.probe import default_probe_loss
    from raytrain_hetero.worker.plan.calibration import PROBE_SALT, ProbeInputs, _batch_maker
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    dm = L7IrishDataModule(paths=str(l7irish), batch_size=4, patch_size=16, length=LENGTH)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=0)
    setup = HeteroSetup(
        run_id="geo", specs=(WorkerSpec(name="a"),), batch=BatchConfig(global_batch_size=8)
    )
    identity = RankIdentity(setup=setup, slot=0, rank=0, world_size=1)
    inputs = ProbeInputs(draws, stack_samples, default_probe_loss, True)
    batch = _batch_maker(identity, inputs, salt=PROBE_SALT)(6)
    assert batch["image"].shape == (6, 9, 16, 16) and batch["mask"].shape == (6, 16, 16)
    drawn = {_key(q) for q in draws.queries(0)}
    assert all(_key(b) in drawn for b in batch["bounds"])


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("data.datamodule_args.paths=/nonexistent/l7", ["DatasetNotFoundError", "paths"]),
        ("model.task_args.backbone=resnet9999", ["model.task_args", "resnet9999"]),
        ("data.datamodule_args.patch_size=4000", ["val_dataloader", "patch_size"]),
    ],
)
def test_cli_construction_errors_are_one_line_and_write_nothing(
    l7irish, tmp_path, capsys, override, names
):
    from raytrain_hetero.app.cli import main

    config = tmp_path / "geo.yaml"
    example = Path(__file__).resolve().parents[2] / "examples/configs"
    text = (example / "torchgeo_geodatamodule_local.yaml").read_text()
    text = text.replace("root: data/l7irish_synth", f"root: {l7irish}")
    config.write_text(text.replace("  generate: {", "  # generate: {"))
    out = tmp_path / "out"
    assert main(["train", str(config), "--output", str(out), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("raytrain-hetero: error: ")
    assert "Fix:" in err and all(name in err for name in names), err
    assert not out.exists()


def test_ghost_groups_hold_on_a_geodatamodules_carved_draws(l7irish):
    """``batchnorm: ghost`` on a torchgeo GeoDataModule (L7Irish: RandomBatchGeoSampler over
    an IntersectionDataset), carved as HeteroDDPStrategy carves it: under plans in whole groups
    of 2 (5:3:2, then 2:3:5 from step 2; the short last step of 7 = 3 groups + 1 joining the
    last), every rank's collated slice, through the datamodule's batch augmentation, holds
    whole groups of the global step's draws in order, so GhostBatchNorm's output on each rank
    is the one-device output on the step's global batch (float64, 1e-12)."""
    from raytrain_hetero.worker.sync.batchnorm.convert import convert_ghost_batchnorm
    from raytrain_hetero.worker.sync.batchnorm.ghost import GhostBatchNorm

    ghost = 2
    dm = L7IrishDataModule(paths=str(l7irish), batch_size=4, patch_size=16, length=LENGTH)
    dm.setup("fit")
    draws = geo_draws(dm.train_dataloader(), seed=0)
    carver = EpochCarver(LENGTH, BATCH, seed=0, min_step_size=3 * ghost)
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(BATCH, SHARES, quantum=ghost))
    schedule.add(Plan.from_shares(BATCH, SWITCHED, version=2, effective_step=2, quantum=ghost))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(9, 4, 3, padding=1), torch.nn.BatchNorm2d(4))
    model = convert_ghost_batchnorm(model.double(), ghost).train()
    assert isinstance(model[1], GhostBatchNorm)

    def prepared(batch: dict) -> torch.Tensor:
        # The datamodule's own batch augmentation (normalisation: order and count kept).
        return dm.aug({"image": batch["image"].float()})["image"].double()

    loaders = [
        iter(
            DataLoader(
                draws.dataset,
                batch_sampler=CarvingBatchSampler(carver, schedule, r, draws=draws.queries),
                collate_fn=stack_samples,
            )
        )
        for r in range(3)
    ]
    queries = draws.queries(0)
    permutation = carver.permutation(0)
    for k in range(carver.steps_per_epoch):
        plan = schedule.plan_for(k)
        counts = carver.step_counts(k, plan)
        start, stop = carver.step_bounds(k)
        size = stop - start
        assert all(n % ghost == 0 for n in counts[:-1]) and (counts[-1] - size % ghost) % ghost == 0
        slices = [next(loader) for loader in loaders]
        assert [len(s["bounds"]) for s in slices] == list(counts)
        # The ranks' draws, in rank order, are the step's draws in carving order.
        step_queries = [queries[i] for i in permutation[start:stop]]
        assert [_key(b) for s in slices for b in s["bounds"]] == [_key(q) for q in step_queries]
        whole = next(iter(DataLoader(draws.dataset, batch_sampler=[step_queries],
                                     collate_fn=stack_samples)))  # fmt: skip
        with torch.no_grad():
            want = model(prepared(whole))
            got = torch.cat([model(prepared(s)) for s in slices])
        assert (got - want).abs().max().item() <= 1e-12, k
    assert carver.steps_per_epoch == 5 and size == 7  # the short last step ran too
