"""Per-rank generator state: captured, serialised to JSON and restored, every draw repeats."""

from __future__ import annotations

import json
import random

import numpy as np
import torch

from raytrain_hetero.worker.state.rng_state import RngState, capture_rng, restore_rng


def _draws() -> tuple:
    dropout = torch.nn.functional.dropout(torch.ones(64), p=0.5, training=True)
    return (dropout.tolist(), np.random.rand(3).tolist(), np.random.randn(), random.random())


def test_restored_generators_repeat_every_draw_through_json():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.randn()  # a cached gaussian is part of numpy's state too
    state = RngState.from_dict(json.loads(json.dumps(capture_rng().to_dict())))
    expected = _draws()
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    assert _draws() != expected
    restore_rng(state)
    assert _draws() == expected
