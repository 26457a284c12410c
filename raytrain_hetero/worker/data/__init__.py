"""Which samples a rank reads: the carving batch sampler and step loader (:mod:`.sampler`),
micro-batches under a memory cap (:mod:`.micro_batches`), the check that every rank carves the
same dataset (:mod:`.dataset_agreement`), evaluation sharded by speed (:mod:`.evaluation`), and a
Ray Data stream carved by the plan (:mod:`.ray_data`).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``; of the worker :mod:`..setup`,
:mod:`..measure` and :mod:`..sync`.
"""
