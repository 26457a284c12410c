"""The application: YAML job schema, the main job, outputs and the command line."""
