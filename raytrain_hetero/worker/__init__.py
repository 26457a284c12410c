"""Code that runs inside Ray Train workers (torch); nothing here imports the driver or the app.

The public worker API is :mod:`.api` (``rh.prepare_model``, ``rh.prepare_data_loader``,
``rh.report``, ...) and :mod:`.lightning` (``rh.lightning``); below them, one sub-package per
concern, listed from the bottom up. Each imports ``raytrain_hetero.core``, ``config``, ``errors``
and ``atomic``, and of this package only the sub-packages listed before it
(``tests/unit/test_layers.py`` checks it, type-only imports included):

1. :mod:`.setup` - who this process is: the run's settings as the workers see them, the
   immutable rank identity, and fault injection at phase points (test and ops tooling).
2. :mod:`.measure` - what a step costs: the compute clock, the ONE slowdown emulator
   (EMULATION), the step's timing accounting and telemetry, probes and memory probes.
3. :mod:`.sync` - how ranks combine: the count-weighted DDP hook, the step guard, and
   BatchNorm under uneven slices (exact, ghost, and the conversion that binds them).
4. :mod:`.data` - which samples a rank reads: the carving sampler and loader, micro-batches
   under a memory cap, the dataset agreement check, sharded evaluation, carved Ray Data.
5. :mod:`.state` - what survives a restart: generator states, the versioned checkpoint state,
   and the preemption watch.
6. :mod:`.plan` - which plan governs a step: plan state and the one way plans are built,
   calibration before the first plan, admission, and the scheduler actor's client.
7. :mod:`.runtime` - the per-process registry of a worker group's parts
   (:class:`~.runtime.registry.WorkerRuntime`) and the steps that act on several parts at once:
   the plan's life, resume, the preemption hand-off, opening a carved Ray Data shard.

Only :mod:`.api` and :mod:`.lightning` read the registry (``get_runtime``); everything below
them gets its parts passed in.
"""
