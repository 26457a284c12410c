"""Who a training-worker process is: the run's settings (:class:`~.identity.HeteroSetup`), its
immutable rank identity (:class:`~.identity.RankIdentity`), and FAULT INJECTION at phase points
(:mod:`.faults`, test and ops tooling).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``, ``atomic``; nothing else of the worker.
"""
