"""The one evaluation loop: top-1 accuracy of a classifier (``torchmetrics``).

Used by the training job (validation after every epoch on every rank's speed-proportional
shard, a map-style dataset of ``{"image", "label"}`` items) and by the benchmark loop (on
memory-mapped arrays, ``benchmarks.loop``); both feed batches of ``(images, labels)`` to
:func:`correct_counts`.
Counts, not accuracies, are what shards add up exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def correct_counts(model: Any, batches: Iterable[tuple[Any, Any]], device: Any) -> tuple[int, int]:
    """Top-1 correct predictions of ``model`` over ``batches`` of ``(images, labels)``
    tensors, and the samples seen.

    The model runs in evaluation mode without gradients and is put back in the mode it was
    in.

    Args:
        model: A classifier returning logits ``(N, classes)``.
        batches: ``(images, labels)`` pairs; images are moved to ``device``.
        device: Where the model lives.
    """
    import torch
    from torchmetrics.classification import MulticlassAccuracy

    metric: MulticlassAccuracy | None = None
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for images, labels in batches:
                logits = model(images.to(device)).cpu()
                if metric is None:  # the class count is the model's, known at the first batch
                    # Local only: torchmetrics would otherwise all-gather over any initialised
                    # process group; a rank evaluating alone would deadlock, and shards add
                    # their counts with one all-reduce (sum_across_ranks).
                    metric = MulticlassAccuracy(
                        num_classes=int(logits.shape[1]),
                        average="micro",
                        sync_on_compute=False,
                        dist_sync_on_step=False,
                    )
                metric.update(logits, torch.as_tensor(labels, dtype=torch.int64).cpu())
    finally:
        model.train(was_training)
    if metric is None:
        return 0, 0
    return int(metric.tp.sum()), int(metric.tp.sum() + metric.fn.sum())


def accuracy(model: Any, batches: Iterable[tuple[Any, Any]], device: Any) -> float:
    """Top-1 accuracy over ``batches`` (:func:`correct_counts`); 0.0 without samples."""
    correct, seen = correct_counts(model, batches, device)
    return correct / seen if seen else 0.0


def dataset_accuracy(model: Any, dataset: Any, device: Any, batch_size: int = 256) -> float:
    """Top-1 accuracy on a map-style dataset of ``{"image": ..., "label": ...}`` items."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size)
    return accuracy(model, ((batch["image"], batch["label"]) for batch in loader), device)
