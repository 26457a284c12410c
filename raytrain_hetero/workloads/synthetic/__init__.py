"""Generators of synthetic datasets in the real on-disk formats (one module per dataset).

Each writes through :func:`~raytrain_hetero.workloads.generated_tree.generate_tree` (cached,
atomic directory publish), so the loaders stay torchgeo's own where torchgeo has one.
"""
