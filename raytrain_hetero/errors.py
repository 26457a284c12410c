"""Exception hierarchy: one root so callers can catch everything raytrain_hetero raises.

Every exception is a plain ``Exception`` subclass whose only constructor argument is the
message, so it pickles across Ray actors and workers unchanged.
"""

from __future__ import annotations


class HeteroError(Exception):
    """Root of every error raised by raytrain_hetero."""


class ConfigError(HeteroError, ValueError):
    """A configuration value is missing or invalid; the message names the field and the fix."""


class DataError(HeteroError):
    """A dataset is missing, corrupt, or does not match what the model expects."""


class AllocationError(HeteroError, ValueError):
    """No integer slicing of the global batch satisfies the caps and minimum slices."""


class PlacementError(HeteroError):
    """Workers could not be matched to nodes or devices as their WorkerSpecs require."""


class ProbeError(HeteroError):
    """A throughput probe failed or produced unusable timings."""


class ModelPreparationError(HeteroError):
    """``prepare_model`` cannot make the model exact under uneven slices (names the layer)."""


class NonFiniteStepError(HeteroError):
    """Too many consecutive optimizer steps had non-finite gradients (names the steps and ranks)."""


class ModelParallelError(HeteroError, ValueError):
    """A model cannot be split or placed as asked (names the layer or branch and the fix)."""


class PreemptionHandoff(HeteroError):
    """Not a failure: an elastic worker group ended itself at the step it agreed on after a
    node's preemption notice, having checkpointed there, so that Ray Train restarts it at once
    on the nodes that stay (counted against ``FailureConfig.max_preemption_failures``)."""
