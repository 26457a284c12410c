"""The generators' shared argument checks (workloads/synthetic/arguments.py)."""

from __future__ import annotations

import numpy as np
import pytest

from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads.synthetic.arguments import (
    check_integers,
    check_split_fractions,
    split_counts,
)


def test_check_integers_names_generator_argument_and_bound() -> None:
    check_integers("generate_x", ("size", np.int64(16), 16), ("seed", 0, 0))
    with pytest.raises(ConfigError, match=r"generate_x: size must be an integer >= 16, got 15"):
        check_integers("generate_x", ("seed", 0, 0), ("size", 15, 16))
    with pytest.raises(ConfigError, match="seed must be an integer >= 0, got True"):
        check_integers("generate_x", ("seed", True, 0))
    with pytest.raises(ConfigError, match="got 3.0"):
        check_integers("generate_x", ("seed", 3.0, 0))


def test_check_split_fractions_returns_floats_and_names_the_splits() -> None:
    assert check_split_fractions("generate_x", [0.6, 0.2, 0.2]) == (0.6, 0.2, 0.2)
    with pytest.raises(ConfigError, match=r"generate_x: .*\(train, val, test\) summing to 1"):
        check_split_fractions("generate_x", (0.5, 0.5))
    with pytest.raises(ConfigError, match=r"got \(0.5, 0.6, -0.1\)"):
        check_split_fractions("generate_x", (0.5, 0.6, -0.1))
    with pytest.raises(ConfigError, match="got None"):
        check_split_fractions("generate_x", None)


def test_split_counts_round_validation_and_test_up_to_one() -> None:
    assert split_counts("g", 20, (0.9, 0.05, 0.05)) == {"train": 18, "val": 1, "test": 1}
    assert split_counts("g", 3, (0.8, 0.1, 0.1)) == {"train": 1, "val": 1, "test": 1}
    assert split_counts("g", 10, (0.6, 0.2, 0.2)) == {"train": 6, "val": 2, "test": 2}
    with pytest.raises(ConfigError, match="raise samples_per_class"):
        split_counts("g", 2, (0.6, 0.2, 0.2))
