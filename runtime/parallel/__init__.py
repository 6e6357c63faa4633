"""Tensor parallelism: launch ranks, process groups, step broadcast, settings agreement, fail-fast."""
