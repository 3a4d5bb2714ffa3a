"""Kernels: `reference` (plain numpy, the spec) and the fast CPU kernels by family."""
