"""The lean runtime: boot images into a device arena, graphs, model families, the worker, the engine."""
