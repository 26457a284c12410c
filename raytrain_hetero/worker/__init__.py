"""Code that runs inside Ray Train workers (torch).

* ``api``: the thin public worker API (``prepare_model``, ``prepare_data_loader``, ``report``...);
  the only reader of the per-process runtime (``context``).
* ``identity``: the run's settings and the immutable rank identity.
* ``context``: the one per-process registry, a runtime composed of focused parts.
* ``timing``: the compute clock and the step in progress; ``emulation``: THE slowdown emulator.
* ``sampler``: carving sampler and loader (builds StepRecords); ``evaluation``: evaluation
  sharded by speed, counts summed; ``ddp``: weighted gradient hook;
  ``batchnorm``: global-statistics BatchNorm, its step binding injected at conversion.
* ``probe`` / ``calibration``: measuring workers; ``planning``: the one plan builder and switch;
  ``checkpoint_state``: versioned resume state; ``scheduler_client``: the scheduler actor's client.

Nothing here imports the driver or the app layer.
"""
