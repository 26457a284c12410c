"""What survives a restart: per-rank generator states (:mod:`.rng_state`), the versioned resume
state written into every checkpoint (:mod:`.checkpoint_state`), and the preemption watch
(:mod:`.preemption`: measured step and checkpoint times, the agreed hand-off).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``, ``atomic``; of the worker
:mod:`..setup`, :mod:`..measure`, :mod:`..sync` and :mod:`..data`.
"""
