"""The benchmark scenarios, their contenders and the targets printed beside the figures.

Data-parallel scenarios (:data:`SCENARIOS`, run by :mod:`benchmarks.runner`) and the
model-parallel ones (:data:`MP_SCENARIOS`, run by :mod:`benchmarks.mp_suite`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BEST_SUBSET",
    "BRANCH_CONFIGS",
    "CONTENDERS",
    "CONV_CONFIGS",
    "DEFAULTS",
    "MP_SCENARIOS",
    "NOISE_AMPLITUDE",
    "SCENARIOS",
    "Scenario",
    "Target",
    "describe_contender",
    "ghost_size_of",
]

#: Every contender, in the order they alternate.
CONTENDERS: dict[str, str] = {
    "stock": "Ray Train TorchTrainer + DDP, DistributedSampler, equal batch B/N per worker",
    "hdp": "uneven slices measured by raytrain_hetero, plain averaging (seed papers' HDP)",
    "hetero": "raytrain_hetero, static plan measured from the first steps, count-weighted gradients",
    "hetero-live": "raytrain_hetero with the live re-planning scheduler",
    "hetero-local": "hetero with batchnorm: local (per-slice statistics, stock's; not exact)",
    # Any hetero-ghost<g> is accepted (ghost_size_of); these two are the candidates.
    "hetero-ghost16": "hetero with batchnorm: ghost, groups of 16 (no exchange in the layers; "
    "the one-device ghost update)",
    "hetero-ghost32": "hetero with batchnorm: ghost, groups of 32",
    "hetero-static-post": "reference: hetero's static plan probed at the POST-drift speeds from "
    "the start (the scenario's injections folded into the workers' base slowdowns)",
    "hetero-live-noise": "hetero-live, no drift, every worker's speed varied ±10% per step "
    "(EMULATED noise; base slowdowns x 1/0.9 so -10% stays representable): counts re-plans",
    "gpu-alone": "raytrain_hetero with only the GPU worker(s), whole global batch",
    # Ablation, in no scenario's default list: what the exact global BatchNorm costs.
    "hetero-nobnsync": "ABLATION: hetero with per-slice BatchNorm statistics (not exact)",
    "best-subset": "the best subset of the workers training alone (every worker of it "
    "training, raytrain_hetero's static plan probed before step 0), found by the benchmark "
    "itself: interchangeable workers merged, dominated ones pruned, subsets whose summed "
    "alone samples/s cannot reach the best screened one skipped, the rest screened by short "
    "fits (benchmarks.best_subset)",
}

#: The contender that runs the library's defaults (every setting left at its default).
DEFAULTS = "hetero-live"

#: The contender every other one is held against: the simple choice of workers.
BEST_SUBSET = "best-subset"


def ghost_size_of(contender: str) -> int | None:
    """The group size of a ``hetero-ghost<g>`` contender (``hetero-ghost16``: 16), else None."""
    prefix = "hetero-ghost"
    if contender.startswith(prefix) and contender[len(prefix) :].isdigit():
        return int(contender[len(prefix) :])
    return None


def describe_contender(contender: str) -> str:
    """The line a result file carries for ``contender`` (any ``hetero-ghost<g>`` included).

    Raises:
        KeyError: ``contender`` is neither in ``CONTENDERS`` nor a ``hetero-ghost<g>``.
    """
    ghost = ghost_size_of(contender)
    if contender not in CONTENDERS and ghost is not None:
        return f"hetero with batchnorm: ghost, groups of {ghost}"
    return CONTENDERS[contender]


@dataclass(frozen=True)
class Target:
    """A goal a figure is held to.

    Attributes:
        metric: ``efficiency``, ``tta_speedup`` (stock's time to accuracy / this one's),
            ``overhead`` (stock's samples/s / this one's - 1), ``speedup`` (samples/s /
            stock's), ``vs_gpu_alone`` (samples/s / gpu-alone's), ``vs_best_subset``
            (samples/s / best-subset's), ``vs_static_post_after_30``
            (samples/s from 30 steps after the injection / hetero-static-post's) or
            ``replans_per_100_steps`` (live re-plans per 100 steps).
        op: ``>=`` or ``<=``.
        value: The goal.
        contenders: Contenders it applies to.
        label: How the table prints it.
    """

    metric: str
    op: str
    value: float
    contenders: tuple[str, ...]
    label: str

    def met(self, figure: float | None) -> bool:
        """Whether ``figure`` meets the goal (a missing or non-finite figure does not)."""
        if figure is None or figure != figure or figure in (float("inf"), float("-inf")):
            return False
        return figure >= self.value if self.op == ">=" else figure <= self.value


@dataclass(frozen=True)
class Scenario:
    """One benchmark scenario.

    Attributes:
        name: CLI name.
        description: One line for the table header.
        emulated: True when heterogeneity is EMULATED (stretched compute), False when real.
        workers: WorkerSpec fields per worker group (emulated_slowdown is the base factor).
        contenders: Contenders that run, in alternation order.
        schedule: Emulated slowdowns injected mid-run (``worker``, ``factor``, ``from_step``),
            applied to every contender.
        kind: ``train`` (one Ray session, alternating fits) or ``join`` (a node added mid-run
            on a ``ray.cluster_utils.Cluster``).
        targets: Goals printed beside the figures.
        defaults: Default sizes (width, global_batch_size, samples_per_class, epochs,
            eval_every, target_accuracy, lr, repeats).
        needs_gpu: Only runs where CUDA is available.
        min_workers: Join only: workers at the start.
        needs_cpus: Only runs where this many logical CPUs are usable (None: any machine).
        pin: Pin each worker's process to its own cores (as many as its ``CPU`` resource,
            disjoint, in worker order; :mod:`benchmarks.pinning`), every contender alike.
    """

    name: str
    description: str
    emulated: bool
    workers: tuple[dict[str, Any], ...]
    contenders: tuple[str, ...]
    schedule: tuple[dict[str, Any], ...] = ()
    kind: str = "train"
    targets: tuple[Target, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    needs_gpu: bool = False
    min_workers: int | None = None
    needs_cpus: int | None = None
    pin: bool = False


def _cpu(
    name: str, slowdown: float = 1.0, count: int = 1, cpus: int = 1, link_s: float = 0.0
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "count": count,
        "resources": {"CPU": cpus},
        "device": "cpu",
        "emulated_slowdown": slowdown,
    }
    if link_s:
        spec["emulated_collective_delay_s"] = link_s
    return spec


def _never_below_best_subset(*contenders: str) -> Target:
    return Target(
        "vs_best_subset",
        ">=",
        0.97,
        contenders or (DEFAULTS,),
        "never slower than the simple choice: samples/s >= 0.97x the best subset of the "
        "workers alone (best-subset, same run)",
    )


_TRAIN = {
    "width": 32,
    "global_batch_size": 192,
    "samples_per_class": 300,
    "epochs": 5,
    "eval_every": 3,
    "target_accuracy": 0.9,
    "lr": 0.05,
    "repeats": 2,
}

_HETERO = ("hetero", "hetero-live")

#: EMULATED per-step noise of the ``hetero-live-noise`` contender (±10 %).
NOISE_AMPLITUDE = 0.1

SCENARIOS: dict[str, Scenario] = {
    "hetero3": Scenario(
        name="hetero3",
        description="3 CPU workers, EMULATED slowdowns 1, 2, 4",
        emulated=True,
        workers=(_cpu("fast", 1), _cpu("medium", 2), _cpu("slow", 4)),
        contenders=("stock", "hdp", "hetero", "hetero-live", BEST_SUBSET),
        targets=(
            _never_below_best_subset(),
            Target("efficiency", ">=", 0.95, _HETERO, "efficiency >= 0.95"),
            Target(
                "tta_speedup",
                ">=",
                2.1,
                _HETERO,
                "time to accuracy >= 2.1x faster than stock at equal final accuracy (±0.5 pt)",
            ),
        ),
        defaults=dict(_TRAIN),
    ),
    "hetero2": Scenario(
        name="hetero2",
        description="2 CPU workers of one core each, EMULATED slowdowns 1, 3 (ideal 2.0x stock)",
        emulated=True,
        workers=(_cpu("fast", 1), _cpu("slow", 3)),
        contenders=("stock", "hetero", "hetero-live", BEST_SUBSET),
        targets=(
            _never_below_best_subset(),
            Target("efficiency", ">=", 0.95, _HETERO, "efficiency >= 0.95"),
            Target(
                "tta_speedup",
                ">=",
                1.9,
                _HETERO,
                "time to accuracy >= 1.9x faster than stock (0.95 of the ideal 2.0x) at "
                "equal final accuracy (±0.5 pt)",
            ),
        ),
        defaults=dict(_TRAIN),
    ),
    "drift": Scenario(
        name="drift",
        description="3 CPU workers, EMULATED slowdowns 1, 2, 4; the fast one slows 3x mid-run",
        emulated=True,
        workers=(_cpu("fast", 1), _cpu("medium", 2), _cpu("slow", 4)),
        contenders=("stock", "hetero", "hetero-live", "hetero-static-post", "hetero-live-noise"),
        schedule=({"worker": "fast", "factor": 3.0, "from_step": 24},),
        targets=(
            Target(
                "vs_static_post_after_30",
                ">=",
                0.9,
                ("hetero-live",),
                "from 30 steps after a 3x slowdown on, samples/s >= 0.9 of the static plan "
                "built for the post-drift speeds (hetero-static-post, same run)",
            ),
            Target(
                "replans_per_100_steps",
                "<=",
                1.0,
                ("hetero-live-noise",),
                "<= 1 re-plan per 100 steps under ±10% per-step noise (no drift)",
            ),
        ),
        defaults={**_TRAIN, "epochs": 8, "eval_every": 4},
    ),
    "homogeneous3": Scenario(
        name="homogeneous3",
        description="3 identical CPU workers (no slowdown): raytrain_hetero's overhead",
        emulated=False,
        workers=(_cpu("w", 1, count=3),),
        contenders=("stock", "hetero", "hetero-local", "hetero-live", BEST_SUBSET),
        targets=(
            _never_below_best_subset(),
            Target("overhead", "<=", 0.03, ("hetero-local",), "batchnorm local: overhead <= 3%"),
            Target("overhead", "<=", 0.138, _HETERO, "exact: overhead <= 13.8% (half of +27.7%)"),
        ),
        defaults={**_TRAIN, "repeats": 3},
    ),
    "homogeneous2": Scenario(
        name="homogeneous2",
        description="2 identical CPU workers of one core each, real speed (no slowdown)",
        emulated=False,
        workers=(_cpu("w", 1, count=2),),
        contenders=("stock", "hetero", "hetero-live", BEST_SUBSET),
        targets=(
            _never_below_best_subset(),
            Target("speedup", ">=", 0.97, (DEFAULTS,), "the defaults >= 0.97x stock"),
        ),
        defaults={**_TRAIN, "repeats": 3},
    ),
    "cpu-gpu-shape": Scenario(
        name="cpu-gpu-shape",
        description="cpu-gpu's shape on CPUs: 1 fast worker bound by a slow loader (EMULATED "
        "read delay), 2 workers 40x slower behind a 0.3 s EMULATED link: they should stand by "
        "or feed",
        emulated=True,
        workers=(_cpu("fast", 1), _cpu("slow", 40, count=2, link_s=0.3)),
        contenders=("stock", DEFAULTS, BEST_SUBSET, "hetero"),
        targets=(_never_below_best_subset(),),
        defaults={**_TRAIN, "epochs": 4, "eval_every": 0, "repeats": 3, "read_delay_s": 0.0025},
    ),
    "join": Scenario(
        name="join",
        description="2 CPU workers, a third node joins mid-run (ray.cluster_utils.Cluster)",
        emulated=False,
        workers=(_cpu("w", 1, count=3),),
        contenders=("stock", "hetero"),
        kind="join",
        min_workers=2,
        defaults={
            "width": 16,
            "global_batch_size": 96,
            "samples_per_class": 300,
            "epochs": 50,
            "eval_every": 0,
            "target_accuracy": 0.9,
            "lr": 0.05,
            "repeats": 2,
            "join_after_steps": 6,
            "steps_at_full": 6,
            "checkpoint_every": 2,
            "monitor_interval_s": 5.0,
        },
    ),
    "cpu-gpu": Scenario(
        name="cpu-gpu",
        description="REAL heterogeneity: 1 GPU worker + 3 CPU workers of 4 cores each",
        emulated=False,
        workers=(
            {"name": "gpu", "count": 1, "resources": {"CPU": 1, "GPU": 1}, "device": "cuda"},
            _cpu("cpu", 1, count=3, cpus=4),
        ),
        contenders=("stock", "hdp", "hetero", "hetero-live", "gpu-alone"),
        targets=(
            Target("speedup", ">=", 10.0, _HETERO, "samples/s >= 10x stock"),
            Target(
                "vs_gpu_alone",
                ">=",
                1.0,
                _HETERO,
                "never below GPU alone: samples/s >= the GPU worker alone (gpu-alone)",
            ),
        ),
        defaults={
            "width": 64,
            "global_batch_size": 1024,
            "samples_per_class": 600,
            "epochs": 12,
            "eval_every": 4,
            "target_accuracy": 0.9,
            "lr": 0.1,
            "repeats": 3,
        },
        needs_gpu=True,
    ),
    "cpu-real3": Scenario(
        name="cpu-real3",
        description="REAL heterogeneity on one many-core machine: CPU workers of 8, 4 and 2 "
        "cores, each pinned to its own cores, no emulation",
        emulated=False,
        workers=(_cpu("big", cpus=8), _cpu("medium", cpus=4), _cpu("small", cpus=2)),
        contenders=("stock", DEFAULTS),
        targets=(Target("efficiency", ">=", 0.9, (DEFAULTS,), "efficiency >= 0.9 (of the ideal)"),),
        defaults={
            "width": 64,
            "global_batch_size": 384,
            "samples_per_class": 600,
            "epochs": 4,
            "eval_every": 0,
            "target_accuracy": 0.9,
            "lr": 0.05,
            "repeats": 1,
        },
        needs_cpus=16,
        pin=True,
    ),
}

# ------------------------------------------------ model parallelism (benchmarks.mp_suite)

#: Worker configurations: EMULATED slowdown factor of each worker (speed = 1 / factor).
CONV_CONFIGS: dict[str, tuple[float, ...]] = {
    "hetero2": (1.0, 2.0),
    "hetero2x4": (1.0, 4.0),  # the 4x speed difference of the proportional-vs-equal target
    "hetero3": (1.0, 2.0, 4.0),
    "same2": (1.0, 1.0),
    "same4": (1.0, 1.0, 1.0, 1.0),
}
BRANCH_CONFIGS: dict[str, tuple[float, ...]] = {"hetero2": (1.0, 2.0), "hetero3": (1.0, 2.0, 4.0)}

MP_SCENARIOS: dict[str, dict[str, Any]] = {
    "conv-split": {
        "description": "Marques' CNN (conv 500 -> 1500 kernels at width 500), conv split vs "
        "data parallelism, EMULATED speeds",
        "full": {
            "width": 32,
            "batches": [32, 128, 512],
            "steps": 2,
            "rounds": 2,
            "configs": ["hetero2", "hetero3", "same2"],
            "delays": [0.0, 0.5, 2.0, 8.0],
            "sweep_batch": 128,
            "lr": 0.01,
        },
        "quick": {
            "width": 8,
            "batches": [16, 32],
            "steps": 1,
            "rounds": 2,
            "configs": ["hetero3"],
            "delays": [0.0, 40.0],
            "sweep_batch": 16,
            "lr": 0.01,
        },
    },
    "branches": {
        "description": "S1+S2 two-branch fusion CNN, branch placement vs data parallelism, "
        "EMULATED speeds",
        "full": {
            "width": 16,
            "batch": 64,
            "epochs": 4,
            "train_samples": 1024,
            "val_samples": 512,
            "micro_batches": 4,
            "configs": ["hetero2", "hetero3"],
            "lr": 0.05,
        },
        "quick": {
            "width": 4,
            "batch": 16,
            "epochs": 2,
            "train_samples": 64,
            "val_samples": 32,
            "micro_batches": 2,
            "configs": ["hetero2", "hetero3"],
            "lr": 0.05,
        },
    },
}
