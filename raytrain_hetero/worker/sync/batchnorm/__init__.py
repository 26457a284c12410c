"""BatchNorm under uneven slices: the exact layer, the ghost layer, and how a model gets them.

* :mod:`.binding` - what the layers need from the training step (injected, never global);
* :mod:`.exact` - :class:`~.exact.HeteroBatchNorm`, global-batch statistics over the ranks;
* :mod:`.ghost` - :class:`~.ghost.GhostBatchNorm`, fixed groups normalised on their own;
* :mod:`.kernels` - torch's native BatchNorm kernels on rows, shared by both layers;
* :mod:`.convert` - converting a model's layers to one mode (imports the others).

Imports: torch, ``raytrain_hetero.errors`` and these modules only.
"""
