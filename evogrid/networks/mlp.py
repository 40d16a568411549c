"""MLP policies for populations: parameters stacked on a leading [pop] axis, applied with vmap."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu, "elu": jax.nn.elu}


class MLP(nn.Module):
    """Dense layers with `activation`; the output goes through tanh into [-1, 1] when `squash`."""

    hidden: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    squash: bool = True

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width)(x))
        x = nn.Dense(self.out_dim, kernel_init=nn.initializers.variance_scaling(0.01, "fan_in", "uniform"))(x)
        return jnp.tanh(x) if self.squash else x


def flat_init(model: nn.Module, key, in_dim: int):
    """(flat parameters [D], unravel) of `model` initialised at `key` for inputs of size `in_dim`, as one
    compiled call (compiled once per model): flax's initialisers run op by op otherwise (1.6 s of a
    3-layer MLP's set-up here)."""
    if model not in _INIT:  # set-up code run once: XLA's cheapest optimisation level compiles it in 0.3 s, not 0.8 s
        _INIT[model] = jax.jit(model.init, compiler_options={"xla_backend_optimization_level": 0,
                                                             "xla_llvm_disable_expensive_passes": True})
    return ravel_pytree(_INIT[model](key, jnp.zeros((in_dim,))))


_INIT = {}   # model -> its jitted init (flax modules are frozen dataclasses: equal configs share it)


@functools.partial(jax.jit, static_argnames=("model", "steps"))
def imitate(model: nn.Module, params, inputs, targets, steps: int = 4000, learning_rate: float = 1e-2):
    """(`params` fitted to map `inputs` [N, in] onto `targets` [N, out], mean squared error per step [steps]):
    full-batch Adam on the mean squared error of the model's output, `steps` steps in one compiled scan.
    Behaviour cloning: a policy that starts from a controller's decisions."""
    optimiser = optax.adam(learning_rate)

    def loss(p):
        return jnp.mean((model.apply(p, inputs) - targets) ** 2)

    def step(carry, _):
        p, opt_state = carry
        value, grad = jax.value_and_grad(loss)(p)
        updates, opt_state = optimiser.update(grad, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), value

    (params, _), losses = jax.lax.scan(step, (params, optimiser.init(params)), None, length=steps)
    return params, losses


def make_vmap_mlp(obs_dim: int, out_dim: int, hidden: Sequence[int] = (32, 32), activation: str = "tanh",
                  squash: bool = True):
    """A population of MLPs.

    Returns (model, init_population, apply_population):
      init_population(key, pop_size) -> params pytree with leaves [pop_size, ...]
      apply_population(params, obs [pop_size, ..., obs_dim]) -> [pop_size, ..., out_dim]
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    model = MLP(tuple(hidden), out_dim, activation, squash)

    def init_population(key, pop_size: int):
        keys = jax.random.split(key, pop_size)
        return jax.vmap(lambda k: model.init(k, jnp.zeros((obs_dim,))))(keys)

    def apply_population(params, obs):
        return jax.vmap(model.apply)(params, obs)

    return model, init_population, apply_population


class MLPEnsemble:
    """`n` independent MLPs with one output each, applied to the same input (twin critics, a value net).

    `init(key, x) -> params` with leaves [n, ...]; `apply(params, x [..., in]) -> [n, ...]`.
    """

    def __init__(self, hidden: Sequence[int], n: int, activation: str = "relu"):
        self.net, self.n = MLP(tuple(hidden), 1, activation, squash=False), n

    def init(self, key, x):
        return jax.vmap(lambda k: self.net.init(k, x))(jax.random.split(key, self.n))

    def apply(self, params, x):
        return jax.vmap(lambda p: self.net.apply(p, x)[..., 0])(params)


@struct.dataclass
class RunningNorm:
    """Running mean/variance of observations (Chan et al. parallel update); part of a workflow's state."""

    mean: jnp.ndarray
    var: jnp.ndarray
    count: jnp.ndarray

    @classmethod
    def create(cls, dim: int) -> "RunningNorm":
        return cls(jnp.zeros((dim,)), jnp.ones((dim,)), jnp.zeros(()))

    def update(self, batch: jnp.ndarray) -> "RunningNorm":
        """Merge a batch [..., dim] of observations."""
        x = batch.reshape(-1, batch.shape[-1])
        return self.merge(jnp.mean(x, axis=0), jnp.var(x, axis=0), x.shape[0])

    def merge(self, mean_b: jnp.ndarray, var_b: jnp.ndarray, n) -> "RunningNorm":
        """Merge the moments of n further observations."""
        n = jnp.asarray(n, self.count.dtype)
        total = self.count + n
        delta = mean_b - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + var_b * n + delta**2 * self.count * n / total
        return RunningNorm(mean, m2 / total, total)

    def normalize(self, obs: jnp.ndarray, clip: float = 10.0) -> jnp.ndarray:
        return jnp.clip((obs - self.mean) / jnp.sqrt(self.var + 1e-8), -clip, clip)
