"""The one evaluation loop (workloads.evaluation), on datasets and on arrays."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gloo_group import run_gloo_group

from benchmarks.loop import arrays_accuracy
from raytrain_hetero.workloads.evaluation import accuracy, dataset_accuracy


class FirstPixelClassifier(torch.nn.Module):
    """Predicts class ``int(x[0, 0, 0])`` (mod 4): accuracy is known exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cls = x[:, 0, 0, 0].long() % 4
        return torch.nn.functional.one_hot(cls, 4).float() * self.scale


def make_data(n: int = 37, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=n)
    predicted = np.where(rng.random(n) < 0.6, labels, (labels + 1) % 4)
    images = np.zeros((n, 2, 3, 3), dtype=np.float32)
    images[:, 0, 0, 0] = predicted
    return images, labels, float(np.mean(predicted == labels))


def test_arrays_accuracy_counts_correct_predictions_and_restores_mode() -> None:
    images, labels, expected = make_data()
    model = FirstPixelClassifier().train()
    got = arrays_accuracy(model, images, labels, torch.device("cpu"), batch_size=8)
    assert got == pytest.approx(expected, abs=1e-6)
    assert model.training
    model.eval()
    arrays_accuracy(model, images, labels, "cpu")
    assert not model.training


def test_dataset_accuracy_matches_arrays_accuracy() -> None:
    images, labels, expected = make_data(n=50, seed=3)
    dataset = [
        {"image": torch.from_numpy(x), "label": torch.tensor(int(y))}
        for x, y in zip(images, labels)
    ]
    model = FirstPixelClassifier()
    assert dataset_accuracy(model, dataset, "cpu", batch_size=7) == pytest.approx(expected)
    assert arrays_accuracy(model, images, labels, "cpu") == pytest.approx(expected)


def test_accuracy_of_nothing_is_zero() -> None:
    assert accuracy(FirstPixelClassifier(), [], "cpu") == 0.0


def _rank_main(rank: int, world_size: int) -> tuple[float, float] | None:
    if rank != 0:  # as stock (bench_stock): only rank 0 validates, the other does not wait
        return None
    images, labels, expected = make_data()
    return arrays_accuracy(FirstPixelClassifier(), images, labels, "cpu"), expected


def test_rank_zero_evaluates_alone_in_a_process_group() -> None:
    # A metric syncing across ranks would block rank 0 (or fail it once rank 1 leaves): the
    # group then fails this test with rank 0's traceback or a timeout.
    got, expected = run_gloo_group(_rank_main, 2, timeout_s=90)[0]
    assert got == pytest.approx(expected)
