"""A dataset added with ``register_dataset`` (EuroSAT's generator and reader under another
name), registered at module level: a job naming it carries this module in ``data.modules``,
so every Ray worker imports it and registers the same adapter."""

from __future__ import annotations

import dataclasses

from raytrain_hetero.workloads.registry import dataset_adapter, register_dataset

REGISTERED_EUROSAT = register_dataset(
    dataclasses.replace(dataset_adapter("eurosat"), name="registered_eurosat")
)
