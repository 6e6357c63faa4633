"""The lean runtime: open images, upload into a device arena, graphs, forward, engine."""
