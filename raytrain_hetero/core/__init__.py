"""Pure decision logic: allocation, weighting, carving and policy.

This package imports only the standard library and numpy (a test enforces it), so it can be
property-tested and reused by the large-cluster simulator without Ray or torch.
"""
