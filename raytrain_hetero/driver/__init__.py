"""Driver side: HeteroTrainer, the Ray Train backend, elastic sizing and the scheduler actor."""
