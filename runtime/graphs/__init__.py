"""The keyed CUDA-graph cache: capture a step once per key, replay it after, agree across ranks."""
