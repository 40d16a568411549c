"""Utilities: `jax_utils` (jit boundary, PRNG and batch helpers)."""
