"""The memory-caps benchmark's ideal ratio (accumulation over cap-only), by hand."""

from __future__ import annotations

import pytest

from benchmarks.memory_caps import ideal_samples_per_s_ratio


def test_ideal_ratio_of_a_capped_fast_worker():
    # Speeds 1, 1/2, 1/4, B=96, cap 16: cap-only (96-16)/0.75 = 106.7 vs 96/1.75 = 54.9.
    assert ideal_samples_per_s_ratio(16, 96, [1.0, 0.5, 0.25]) == pytest.approx(1.9444, abs=1e-3)
    # A cap at or above the share costs nothing.
    assert ideal_samples_per_s_ratio(60, 96, [1.0, 0.5, 0.25]) == pytest.approx(1.0)
