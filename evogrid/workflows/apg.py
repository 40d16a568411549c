"""APGWorkflow: analytic policy gradients, the policy trained by differentiating the task (`--algorithm apg`).

The environments are differentiable (the DC and radial power flows carry their implicit-function
derivatives, the safety layers the derivative of their fixed count of steps), so the return of a day
played by a deterministic MLP policy is a differentiable function of its parameters. One step of this
workflow plays `episodes_per_individual` training days drawn at random, each from its start to the
horizon (`rollout.play_days`, no resets inside), and takes one Adam step on the mean constrained return
(the same `fitness` as the evolution strategies: the return penalised by the Lagrangian) by
backpropagation through the 48 steps of each day, the safety layer included where it is on. This is the
"analytic policy gradient" of differentiable simulators (Freeman et al., Brax, 2021; SHAC, Xu et al.,
2022, shortens the horizon with a critic, which these day-long tasks do not need).

Why it is here: near a good policy the cost of a feeder or dispatch task is first-order in the action's
error (the operator's decisions sit where a limit binds), and a gradient gives the direction an
evolution strategy has to sample. It is the ECWorkflow loop with one member: the same start (random, or
with `init="operator"` the MLP fitted to the MPC's decisions), observation statistics, choice on the
validation days every `select_every` steps and evaluation; a checkpoint holds the parameters and
Adam's moments. On several devices each plays its share of a step's days (their count must divide
evenly), and the gradient is summed over the devices: the same step as on one device up to the rounding
of that sum. A step whose gradient is not finite is skipped (no update) and counted in the metric
`nonfinite_grad`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from evogrid.rollout import play_days
from evogrid.utils.config import param
from evogrid.utils.jax_utils import tree_where
from evogrid.utils.sharding import split_and_gather
from evogrid.workflows.ec import ALGORITHMS, ECConfig, ECState, ECWorkflow, pool_moments


@dataclasses.dataclass(frozen=True)
class APGConfig(ECConfig):
    """An ECConfig whose one member is trained by gradients through the task (see the module docstring)."""

    algorithm: str = param("apg", "analytic policy gradient", choices=("apg",))
    episodes_per_individual: int = param(8, "training days each gradient step plays (drawn without replacement)",
                                         lo=1, cli="--episodes")
    learning_rate: float = param(1e-3, "Adam step size", lo=0.0, lo_open=True, cli="--lr")
    max_grad_norm: float = param(1.0, "the gradient is scaled down to at most this global norm", lo=0.0, lo_open=True)

    @classmethod
    def _owners(cls) -> dict:
        population = {name: ALGORITHMS for name in ("pop_size", "sigma", "eval_block")}
        return {**population, **super()._owners(), "learning_rate": ("apg",)}


@dataclasses.dataclass(frozen=True)
class GradientStep:
    """The 'strategy' of APGWorkflow: its state is the parameters and the optimiser's state."""

    optimizer: optax.GradientTransformation

    def init(self, key, mean):
        del key
        return {"params": mean, "opt": self.optimizer.init(mean)}

    def center(self, state):
        return state["params"]


class APGWorkflow(ECWorkflow):
    """Train an MLP policy for `config.task` by gradients through the env (see the module docstring)."""

    def check_mesh(self):
        """A step's days, not a population, are split over the devices: their count must divide evenly."""
        n_days = min(self.config.episodes_per_individual, self.env.num_days(self.env_params))
        n_dev = self.mesh.devices.size
        if n_days % n_dev:
            raise ValueError(f"each step's {n_days} days cannot be split evenly over the {n_dev} devices of the mesh: "
                             f"use episodes_per_individual (--episodes) a multiple of {n_dev}, or pass "
                             "mesh=population_mesh(jax.devices()[:k]) with k dividing it")

    def make_strategy(self, flat):
        config = self.config
        return GradientStep(optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate)))

    def _play_days(self, flat, norm, days, key):
        """`play_days` metrics [n_days, ...] of the policy `flat` on `days`, replicated: on several devices each
        plays its share of the days and an all-gather hands every device all of them (`split_and_gather`)."""
        def play(flat, days):
            return play_days(self.env, self.env_params, self._policy(flat, norm), days=days, key=key,
                             obs_moments=self.config.obs_norm)

        if self.mesh.devices.size == 1:
            return play(flat, days)
        return split_and_gather(lambda d, f: play(f, d), self.mesh, days, flat)

    def _step(self, state: ECState):
        config = self.config
        key = jax.random.wrap_key_data(state.key)
        key, k_days, k_play = jax.random.split(key, 3)
        n_days = self.env.num_days(self.env_params)
        days = jax.random.choice(k_days, n_days, (min(config.episodes_per_individual, n_days),), replace=False)
        flat = state.es_state["params"]

        def loss(flat):
            metrics = self._play_days(flat, state.obs_norm, days, k_play)
            fitness = self.fitness(metrics["episode_return"], metrics["episode_cost"], state.lagrangian)
            return -jnp.mean(fitness), metrics

        (_, metrics), grad = jax.value_and_grad(loss, has_aux=True)(flat)
        finite = jnp.all(jnp.isfinite(grad))
        updates, opt = self.strategy.optimizer.update(grad, state.es_state["opt"], flat)
        # a zero gradient would still move Adam's parameters by its decaying moments: keep the whole state
        es_state = tree_where(finite, {"params": optax.apply_updates(flat, updates), "opt": opt}, state.es_state)
        returns, costs = metrics["episode_return"], metrics["episode_cost"]
        due = state.generation % config.select_every == 0
        best = jax.lax.cond(due, lambda: self._select(state, es_state["params"][None]),
                            lambda: (state.best_params, state.best_obs_norm, state.chosen))
        state = state.replace(
            key=jax.random.key_data(key), es_state=es_state,
            obs_norm=pool_moments(state.obs_norm, metrics) if config.obs_norm else state.obs_norm,
            lagrangian=state.lagrangian.update(costs.mean(0), returns.mean(), config),
            generation=state.generation + 1, best_params=best[0], best_obs_norm=best[1], chosen=best[2],
        )
        return state, {
            "return": returns.mean(), "cost_total": costs.sum(-1).mean(), "cost_channels": costs.mean(0),
            "grad_norm": jnp.linalg.norm(grad), "nonfinite_grad": (~finite).astype(jnp.float32),
            "multiplier": state.lagrangian.multiplier, **state.chosen.metrics(),
            "env_steps": (state.generation * days.shape[0] * self.env_params.max_steps).astype(jnp.float32),
        }
