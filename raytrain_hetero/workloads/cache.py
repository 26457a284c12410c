"""Keep a dataset's decoded items in memory, for small datasets read every epoch."""

from __future__ import annotations

import logging
import time
from typing import Any

from torch.utils.data import Dataset

logger = logging.getLogger(__name__)


class InMemoryDataset(Dataset):
    """Reads every item of ``dataset`` once (through the dataset's own loader) and serves copies.

    Decoding a 13-band TIFF costs about as much as a small CNN's forward pass; caching keeps
    that off every training step. Memory is the decoded size of the whole dataset in each
    worker (about 0.2 MB per 13x64x64 float32 EuroSAT image), so use it for small datasets.

    Args:
        dataset: Map-style dataset with ``len()``.
    """

    def __init__(self, dataset: Dataset) -> None:
        started = time.perf_counter()
        # Kept so ranks can compare the source's file list (prepare_data_loader's agreement).
        self.dataset = dataset
        self.items = [dataset[i] for i in range(len(dataset))]  # type: ignore[arg-type]
        logger.info("cached %d items in %.1f s", len(self.items), time.perf_counter() - started)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]
