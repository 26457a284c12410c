"""``python -m benchmarks.conv_gpu_probe``: the layer shapes it probes, and its refusal without
a GPU (the figures themselves come from a lent GPU machine: benchmarks/results/cpu-gpu)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.conv_gpu_probe import _layer_inputs, main
from raytrain_hetero.workloads.models import MarquesCNN


def test_the_probed_shapes_are_what_each_conv_layer_sees_in_the_network():
    model = MarquesCNN(width=8)
    seen = {}
    model.conv1.register_forward_hook(lambda m, i, o: seen.__setitem__("conv1", i[0].shape))
    model.conv2.register_forward_hook(lambda m, i, o: seen.__setitem__("conv2", i[0].shape))
    model(torch.zeros(5, 3, 32, 32))
    assert {k: tuple(v) for k, v in seen.items()} == _layer_inputs(8, 5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_without_a_gpu_it_says_so_and_probes_nothing():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        main(["--width", "8"])


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--width", "1", "below 2"), ("--batch", "0", "below 1"), ("--cpus", "x", "not a whole")],
)
def test_bad_options_are_refused_by_name(flag, value, says, capsys):
    with pytest.raises(SystemExit):
        main([flag, value])
    err = capsys.readouterr().err
    assert flag in err and says in err
