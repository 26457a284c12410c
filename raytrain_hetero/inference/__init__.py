"""Distributed prediction with Ray Data on heterogeneous workers."""
