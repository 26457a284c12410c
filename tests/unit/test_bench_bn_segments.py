"""benchmarks.bn_segments, run as its user runs it (a new interpreter, two gloo ranks)."""

from __future__ import annotations

from repo_python import run_in_repo

ARGS = ["--slices", "4,2", "--factors", "1,2", "--width", "4", "--steps", "2", "--rounds", "1"]


def test_bn_segments_splits_exact_minus_local_into_three_parts_that_add_up():
    done = run_in_repo(["-m", "benchmarks.bn_segments", *ARGS], timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "slices 4/2, EMULATED factors 1/2, 2 gloo ranks" in lines[0]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:4]}
    # Local: the work, the gradient all-reduce, the tail. Exact: SmallCNN's three BatchNorm
    # layers add two exchanges each (forward, backward), each started and awaited apart.
    assert rows["local"][-1] == "2" and rows["exact"][-1] == "14"
    for step, busy, segment_max, _ in rows.values():
        # Per step, the sum of segment maxima >= the slowest rank's sum: so are their medians.
        assert 0 < float(busy) <= float(segment_max) + 0.05 and float(step) > 0
    extra, parts = lines[4].removeprefix("exact - local: ").split(" = ")
    values = [float(part.split()[-1]) for part in parts.split(", ")]
    assert [part.rsplit(" ", 1)[0] for part in parts.split(", ")] == [
        "compute",
        "per-layer imbalance",
        "exchanges and scheduling",
    ]
    assert abs(sum(values) - float(extra)) <= 0.2  # each printed to 0.1 ms
    assert abs(float(extra) - (float(rows["exact"][0]) - float(rows["local"][0]))) <= 0.11
    for mode, line in zip(("local", "exact"), lines[5:7], strict=True):
        assert line.startswith(f"{mode} busy by rank: ") and len(line.split(": ")[1].split()) == 2
    segments = [line.split(": ")[1].split() for line in lines[7:]]
    assert len(segments) == 2 and all(len(s) == 14 for s in segments)


def test_bn_segments_refuses_bad_ranks_in_one_line():
    for args, says in (
        (["--slices", "4,x"], "--slices takes integers and --factors numbers"),
        (["--slices", "4", "--factors", "1"], "need the same number (>= 2) of ranks"),
        (["--slices", "4,2", "--factors", "1,0.5"], "factors >= 1"),
    ):
        done = run_in_repo(["-m", "benchmarks.bn_segments", *args], timeout=120)
        assert done.returncode == 2 and says in done.stderr.splitlines()[-1], done.stderr
