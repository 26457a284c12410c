"""How ranks combine their work: DDP with count-weighted gradient synchronisation
(:mod:`.ddp`), the step guard that skips a non-finite step on every rank (:mod:`.guard`), and
BatchNorm under uneven slices (:mod:`.batchnorm`).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``; of the worker :mod:`..setup` and
:mod:`..measure`.
"""
