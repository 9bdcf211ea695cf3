"""zoo's composition root: the CLI, the model catalogue, the convert -> verify -> bench pipeline."""
