"""Compute kernels (Triton) beside their torch references."""
