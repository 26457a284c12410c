"""``python -m benchmarks.conv_gpu_probe``: the conv split's inputs on a real GPU + CPU machine.

Probes Marques' CNN conv layers (``MarquesCNN``, the paper's width 500: 500 then 1,500
kernels) with the library's own :func:`~raytrain_hetero.parallel.conv_state.probe_kernel_cost`
on the GPU and on CPU workers of ``--cpu-threads`` intra-op threads (the ``cpu-gpu``
scenario's CPU worker size), then splits each layer's kernels over one GPU and ``--cpus`` CPU
workers with :func:`~raytrain_hetero.core.kernel_split.split_kernels` and prints the layer's
predicted makespan against the GPU computing the layer alone.

This measures what the split is decided from (each device's per-kernel cost) and what it
predicts; it does not run the split end to end (the conv-split bench loop runs every worker
on CPU). The prediction leaves out the exchange of the CPU workers' output blocks (printed
as bytes per step), which only adds to the split's time.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from raytrain_hetero.core.kernel_split import split_kernels
from raytrain_hetero.parallel.conv_state import probe_kernel_cost
from raytrain_hetero.workloads.models import MarquesCNN

_ELEMENT_BYTES = 4  # float32


def _layer_inputs(width: int, batch: int) -> dict[str, tuple[int, ...]]:
    # conv1 sees the 32x32 RGB image; conv2 the pooled 16x16 map of conv1's kernels.
    return {"conv1": (batch, 3, 32, 32), "conv2": (batch, width, 16, 16)}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """Probe both conv layers on both devices; split them; return the figures."""
    if not torch.cuda.is_available():
        raise SystemExit("conv_gpu_probe needs a CUDA device (none is visible)")
    torch.manual_seed(0)
    model = MarquesCNN(width=args.width)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "width": args.width,
        "batch": args.batch,
        "cpu_threads": args.cpu_threads,
        "cpus": args.cpus,
        "layers": {},
    }
    for name, shape in _layer_inputs(args.width, args.batch).items():
        conv = getattr(model, name)
        kernels = conv.out_channels
        torch.set_num_threads(args.cpu_threads)
        # A CPU worker's full layer takes seconds at width 500: probe a few kernels.
        cpu = probe_kernel_cost(
            conv, shape, device="cpu", kernel_counts=(4, 16), repeats=args.repeats
        )
        gpu = probe_kernel_cost(
            conv.to("cuda"),
            shape,
            device="cuda",
            kernel_counts=(max(1, kernels // 4), kernels),
            repeats=args.repeats,
            warmup=2,
        )
        conv.to("cpu")
        betas = [gpu.beta] + [cpu.beta] * args.cpus
        alphas = [gpu.alpha] + [cpu.alpha] * args.cpus
        split = split_kernels(kernels, betas, alphas)
        per_rank = [a + b * k for a, b, k in zip(alphas, betas, split, strict=True)]
        alone = gpu.alpha + gpu.beta * kernels
        out_pixels = shape[2] * shape[3]
        cpu_bytes = sum(split[1:]) * args.batch * out_pixels * _ELEMENT_BYTES
        result["layers"][name] = {
            "kernels": kernels,
            "gpu_cost": {"alpha_s": gpu.alpha, "beta_s_per_kernel": gpu.beta},
            "cpu_cost": {"alpha_s": cpu.alpha, "beta_s_per_kernel": cpu.beta},
            "gpu_over_cpu_per_kernel": cpu.beta / gpu.beta if gpu.beta > 0 else None,
            "split": list(split),
            "predicted_layer_s": max(per_rank),
            "gpu_alone_s": alone,
            "predicted_speedup_vs_gpu_alone": alone / max(per_rank),
            "cpu_block_output_bytes_per_step": cpu_bytes,
        }
    return result


def _at_least(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give {minimum} or more")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Parse, probe, print a table and the JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conv_gpu_probe")
    parser.add_argument(
        "--width", type=_at_least(2), default=500, help="MarquesCNN width (paper: 500)"
    )
    parser.add_argument("--batch", type=_at_least(1), default=64, help="batch of the probe")
    parser.add_argument("--cpus", type=_at_least(0), default=3, help="CPU workers beside the GPU")
    parser.add_argument(
        "--cpu-threads", type=_at_least(1), default=4, help="threads per CPU worker"
    )
    parser.add_argument("--repeats", type=_at_least(1), default=3, help="timed rounds per count")
    args = parser.parse_args(argv)
    result = probe(args)
    print(f"GPU {result['gpu']}, torch {result['torch']}, width {args.width}, batch {args.batch}")
    print(
        "| layer | kernels | GPU s/kernel | CPU s/kernel | GPU/CPU speed | split | "
        "layer s (split) | layer s (GPU alone) | speedup |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, layer in result["layers"].items():
        print(
            f"| {name} | {layer['kernels']} | {layer['gpu_cost']['beta_s_per_kernel']:.2e} | "
            f"{layer['cpu_cost']['beta_s_per_kernel']:.2e} | "
            f"{layer['gpu_over_cpu_per_kernel']:.1f}x | {layer['split']} | "
            f"{layer['predicted_layer_s']:.4f} | {layer['gpu_alone_s']:.4f} | "
            f"{layer['predicted_speedup_vs_gpu_alone']:.3f}x |"
        )
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
