"""What a step costs: the compute clock (:mod:`.clock`), the ONE slowdown emulator
(:mod:`.emulation`, EMULATION for CPU-only testing), the step in progress and its accounting
(:mod:`.timing`), the step's telemetry (:mod:`.telemetry`), timed probes (:mod:`.probe`) and
memory probes (:mod:`.memory_probe`).

Imports: ``raytrain_hetero.core``, ``config``, ``errors``; of the worker only :mod:`..setup`.
"""
