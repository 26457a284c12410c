"""The one evaluation loop: top-1 accuracy of a classifier (``torchmetrics``).

Used by the training job (validation after every epoch, on a map-style dataset of
``{"image", "label"}`` items) and by the benchmark loop (on memory-mapped arrays); both feed
batches of ``(images, labels)`` to :func:`accuracy`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["accuracy", "arrays_accuracy", "dataset_accuracy"]

logger = logging.getLogger(__name__)


def accuracy(model: Any, batches: Iterable[tuple[Any, Any]], device: Any) -> float:
    """Top-1 accuracy of ``model`` over ``batches`` of ``(images, labels)`` tensors.

    The model runs in evaluation mode without gradients and is put back in the mode it was
    in. Returns 0.0 when there is no sample (nothing was classified correctly).

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
                    # process group, and a rank evaluating alone (rank 0) would deadlock.
                    metric = MulticlassAccuracy(
                        num_classes=int(logits.shape[1]),
                        average="micro",
                        sync_on_compute=False,
                        dist_sync_on_step=False,
                    )
                metric.update(logits, torch.as_tensor(labels, dtype=torch.int64).cpu())
    finally:
        model.train(was_training)
    if metric is None or int(metric.tp.sum() + metric.fn.sum()) == 0:
        return 0.0
    return float(metric.compute())


def dataset_accuracy(model: Any, dataset: Any, device: Any, batch_size: int = 256) -> float:
    """Top-1 accuracy on a map-style dataset of ``{"image": ..., "label": ...}`` items."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size)
    return accuracy(model, ((batch["image"], batch["label"]) for batch in loader), device)


def arrays_accuracy(
    model: Any, images: Any, labels: Any, device: Any, batch_size: int = 256
) -> float:
    """Top-1 accuracy on arrays (e.g. memory-mapped ``.npy``) of images and labels."""
    import numpy as np
    import torch

    def batches() -> Iterable[tuple[Any, Any]]:
        for start in range(0, len(labels), batch_size):
            x = np.asarray(images[start : start + batch_size], dtype=np.float32)
            y = np.asarray(labels[start : start + batch_size])
            yield torch.from_numpy(x), torch.from_numpy(y)

    return accuracy(model, batches(), device)
