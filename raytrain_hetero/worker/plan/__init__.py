"""Which plan governs a step: plan state and the ONE way plans are built and switched
(:mod:`.planning`), measuring the group before its first plan (:mod:`.calibration`), admission
(:mod:`.admission`), and the client of the run's scheduler actor (:mod:`.scheduler_client`).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``; of the worker every sub-package
listed before it (:mod:`..setup`, :mod:`..measure`, :mod:`..sync`, :mod:`..data`,
:mod:`..state`).
"""
