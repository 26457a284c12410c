"""Large-cluster simulator over the pure core (allocation and re-plan policy)."""
