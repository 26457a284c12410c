"""The per-process registry of a worker group's parts (:mod:`.registry`) and the steps that act
on several parts at once: the plan's life on a worker (:mod:`.plan_flow`), writing and resuming
checkpoints (:mod:`.resume`), the preemption hand-off (:mod:`.handoff`), and opening a carved
Ray Data shard (:mod:`.shards`). Called by the public worker API (:mod:`..api`,
:mod:`..lightning`) only.

Imports: ``raytrain_hetero.core``, ``config``, ``errors``, ``atomic``; of the worker every
other sub-package.
"""
