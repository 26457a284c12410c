"""benchmarks.bn_ghost_kernel, run as its user runs it (a new interpreter, smallest sizes)."""

from __future__ import annotations

from repo_python import run_in_repo

ARGS = ["--slices", "32", "--width", "4", "--rounds", "1", "--iters", "1", "--model-rounds", "1"]


def test_bn_ghost_kernel_prints_layers_steps_and_the_precision_check():
    done = run_in_repo(["-m", "benchmarks.bn_ghost_kernel", *ARGS], timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    layers = [line.split() for line in lines if line.startswith("[32,")]
    assert [row[:4] for row in layers] == [
        ["[32,", "4,", "32,", "32]"],
        ["[32,", "8,", "16,", "16]"],
        ["[32,", "8,", "8,", "8]"],
    ]
    steps = [line.split() for line in lines if line.startswith("n=32")]
    assert len(steps) == 1
    for row in [*layers, *steps]:
        assert all(float(value.rstrip("x")) > 0 for value in row[-6:])
    errors = {
        line.split()[0]: float(line.split()[-1]) for line in lines if "relative norm error" in line
    }
    assert set(errors) == {"native", "first", "ghost"}
    # Deterministic (fixed data): the ghost kernels stay near float64, torch's does not.
    assert errors["ghost"] < 3e-7 and errors["first"] < 3e-7 and errors["native"] > 1e-5
