"""A fixed-size replay buffer in JAX arrays (part of a workflow's state): circular writes, uniform sampling."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ReplayBuffer:
    data: dict               # name -> [capacity, ...]
    ptr: jnp.ndarray         # int32 next write position
    size: jnp.ndarray        # int32 number of valid rows

    @classmethod
    def create(cls, capacity: int, example: dict) -> "ReplayBuffer":
        """`example`: one transition (name -> array); storage is zeros of shape [capacity, *shape]."""
        data = {k: jnp.zeros((capacity,) + jnp.shape(v), jnp.asarray(v).dtype) for k, v in example.items()}
        return cls(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    @property
    def capacity(self) -> int:
        return next(iter(self.data.values())).shape[0]

    def add(self, batch: dict) -> "ReplayBuffer":
        """Write a batch (name -> [n, ...]); past the end it wraps around and overwrites the oldest rows."""
        n = next(iter(batch.values())).shape[0]
        idx = (self.ptr + jnp.arange(n)) % self.capacity
        data = {k: self.data[k].at[idx].set(batch[k].astype(self.data[k].dtype)) for k in self.data}
        return ReplayBuffer(data, ((self.ptr + n) % self.capacity).astype(jnp.int32),
                            jnp.minimum(self.size + n, self.capacity).astype(jnp.int32))

    def sample(self, key, batch_size: int) -> dict:
        idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(self.size, 1))
        return {k: v[idx] for k, v in self.data.items()}
