"""Box spaces (gymnax-style)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Box:
    """A box [low, high] of the given shape (low/high broadcast to it)."""

    low: np.ndarray | float
    high: np.ndarray | float
    shape: tuple[int, ...]
    dtype: object = jnp.float32

    def sample(self, key: jax.Array) -> jnp.ndarray:
        low = jnp.broadcast_to(jnp.asarray(self.low, self.dtype), self.shape)
        high = jnp.broadcast_to(jnp.asarray(self.high, self.dtype), self.shape)
        finite = jnp.isfinite(low) & jnp.isfinite(high)
        u = jax.random.uniform(key, self.shape, self.dtype)
        return jnp.where(finite, low + u * (high - low), jax.random.normal(key, self.shape, self.dtype))

    def contains(self, x) -> jnp.ndarray:
        x = jnp.asarray(x)
        return (x.shape == self.shape) & jnp.all((x >= self.low) & (x <= self.high))
