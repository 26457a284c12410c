"""Ray Tune searches over raytrain_hetero jobs."""
