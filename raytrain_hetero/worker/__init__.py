"""Code that runs inside Ray Train workers (torch): the worker API, sampler, DDP hook, BatchNorm.

Nothing here imports the driver or the app layer (a test enforces it).
"""
