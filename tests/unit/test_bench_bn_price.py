"""benchmarks.bn_price, run as its user runs it (a new interpreter, a one-rank gloo group)."""

from __future__ import annotations

from repo_python import run_in_repo

ARGS = ["--slices", "4,2", "--width", "4", "--rounds", "1", "--iters", "1"]


def test_bn_price_prints_a_row_per_slice_with_exact_minus_torch():
    done = run_in_repo(["-m", "benchmarks.bn_price", *ARGS], timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "3 BatchNorm layers" in lines[0]  # SmallCNN's, all converted
    rows = [line.split() for line in lines[2:]]
    assert [int(r[0]) for r in rows] == [4, 2]
    for _, plain, exact, extra, percent in rows:
        assert float(plain) > 0 and float(exact) > 0
        assert abs(float(exact) - float(plain) - float(extra)) <= 0.011
        assert percent.endswith("%")
