"""ECWorkflow: evolve MLP policies with an evosax strategy or the native GA.

One generation is one compiled call: ask -> population [pop, D] of flattened MLP parameters ->
`jit(vmap(rollout))` over the population (each individual plays the same
`episodes_per_individual` episodes, common random numbers, in a `TrainingWrapper`; episodes run
to the horizon without per-step resets) -> fitness -> tell. Fitness is maximised: by default
the return penalised by the constraint mechanism (evogrid.constraints). The sign flip for evosax lives in `EvosaxStrategy.tell`.

Devices: the workflow holds a 1-D mesh over all devices (`utils.sharding`); the state is
replicated, the population is split over the devices for the rollouts (`shard_map`), and
results are gathered before fitness and tell, so every reduction over the population runs
on the whole array. Each device evaluates its share in blocks of `eval_block` individuals
(a `lax.map` over blocks, `vmap` inside). XLA picks kernels by shape, so a vmapped
rollout of 4 individuals can round differently from one of 8: with `eval_block` fixed
(e.g. pop_size / the largest device count you will use) every device runs the same
block shape and results are bit-identical for any device count (tested with 1 and 2
devices and with two processes). With the default 0 a device evaluates its whole share
at once (fastest) and runs on different device counts agree to float rounding.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.flatten_util import ravel_pytree

from evogrid.algorithms import EVOSAX_ALGORITHMS, EvosaxStrategy, GeneticAlgorithm
from evogrid.algorithms.es import ANTITHETIC, OPTIMISED
from evogrid.constraints import ConstraintConfig, Lagrangian
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.networks import RunningNorm, flat_init, imitate, make_vmap_mlp
from evogrid.networks.mlp import ACTIVATIONS
from evogrid.rollout import play_days, rollout
from evogrid.utils.config import param, refuse_unused
from evogrid.utils.jax_utils import tree_where
from evogrid.utils.sharding import (
    check_divisible,
    gather,
    population_mesh,
    replicate,
    split_and_gather,
)
from evogrid.workflows.base import EVAL_SEED, Chosen, Workflow

ALGORITHMS = EVOSAX_ALGORITHMS + ("GA",)


@dataclasses.dataclass(frozen=True)
class ECConfig(ConstraintConfig):
    """Static structure and hyperparameters of an EC run (all of it is recorded with checkpoints)."""

    task: str = param("tso-case14", "task name (see `evogrid tasks`)")
    algorithm: str = param("Open_ES", "evolution strategy", choices=ALGORITHMS)
    pop_size: int = param(64, "population size", lo=2, cli="--pop")
    episodes_per_individual: int = param(4, "episodes each individual plays per generation", lo=1, cli="--episodes")
    hidden: tuple[int, ...] = param((32, 32), "MLP hidden layer widths", lo=1)
    activation: str = param("tanh", "MLP activation", choices=tuple(ACTIVATIONS))
    policy_output: str = param("action", "what the MLP outputs: 'action' (the env's actions: on transmission tasks "
                               "each unit's position in its ramp window) or 'setpoint' (transmission tasks: each "
                               "unit's set-point in [Pmin, Pmax], asked for from the last output it observes)",
                               choices=("action", "setpoint"))
    init: str = param("random", "where the search starts: random MLP weights, or 'operator': the MLP fitted to the "
                      "operator's MPC on training days (behaviour cloning; transmission and dso tasks; search near "
                      "it with a smaller sigma, e.g. 0.02)",
                      choices=("random", "operator"))
    init_days: int = param(40, "init='operator': the training days the MPC plays for the fit (at most all 40)", lo=1)
    init_augment: int = param(0, "init='operator' on dso: perturbed copies of every demonstrated interval (loads "
                              "and PV scaled, log-normal), each labelled by the MPC, so the fit generalises beyond "
                              "the training days", lo=0)
    sigma: float = param(0.05, "initial search std (ES) / mutation std (GA)", lo=0.0, lo_open=True)
    learning_rate: float = param(0.03, "ES optimiser step size (Open_ES, SNES, xNES, PGPE, ARS)", lo=0.0, lo_open=True,
                                 cli="--lr")
    obs_norm: bool = param(True, "normalise observations with running statistics")
    vmap_step: bool = param(True, "vmap the env batch (false: lax.map, lower memory)")
    eval_episodes: int = param(16, "evaluation episodes of tasks without days (gymnax); day tasks play every test day", lo=1)
    select_every: int = param(5, "generations between re-evaluations of candidate policies on the validation days", lo=1)
    eval_block: int = param(0, "individuals evaluated together per device; 0 = the whole share (see ec.py)", lo=0)
    elite: int = param(4, "GA: members copied unchanged", lo=0)
    mutation_rate: float = param(1.0, "GA: share of parameters perturbed", lo=0.0, hi=1.0)
    seed: int = param(0, "random seed", lo=0)

    def _check(self):
        if self.algorithm in ANTITHETIC and self.pop_size % 2:
            raise ValueError(f"{self.algorithm} samples antithetic pairs: pop_size must be even, got {self.pop_size}")
        if self.algorithm == "GA" and self.elite >= self.pop_size:
            raise ValueError(f"elite must be in [0, pop_size - 1] = [0, {self.pop_size - 1}], got {self.elite}")
        if self.eval_block and self.pop_size % self.eval_block:
            raise ValueError(f"eval_block must be 0 or divide pop_size {self.pop_size}, got {self.eval_block}")
        refuse_unused(self, "algorithm", self._owners())

    @classmethod
    def _owners(cls) -> dict:
        """Options only some algorithms use -> those algorithms (`refuse_unused`, `unused_options`)."""
        return {"learning_rate": OPTIMISED, "elite": ("GA",), "mutation_rate": ("GA",)}


def pool_moments(norm: RunningNorm, metrics) -> RunningNorm:
    """`norm` with the observation moments of a batch of rollouts merged in (`metrics`' obs_mean [B, D],
    obs_var [B, D] and obs_count [B], pooled by count)."""
    w = metrics["obs_count"] / metrics["obs_count"].sum()
    mean = jnp.einsum("p,pd->d", w, metrics["obs_mean"])
    var = jnp.einsum("p,pd->d", w, metrics["obs_var"] + metrics["obs_mean"] ** 2) - mean**2
    return norm.merge(mean, jnp.maximum(var, 0.0), metrics["obs_count"].sum())


@struct.dataclass
class ECState:
    key: jnp.ndarray            # uint32 key data (checkpoint friendly)
    es_state: Any
    obs_norm: RunningNorm
    lagrangian: Lagrangian
    generation: jnp.ndarray     # int32
    best_params: jnp.ndarray    # [D] the policy chosen on the validation days so far (flattened MLP parameters)
    best_obs_norm: RunningNorm  # the observation statistics it runs with
    chosen: Chosen              # its validation record (base.Chosen)


class ECWorkflow(Workflow):
    """Evolve an MLP policy for `config.task` (or for an env/params you pass).

    Subclass and override `fitness(returns, costs, lagrangian)` to change what is maximised
    (see examples/cost_constrained_es.py).
    """

    config_type = ECConfig

    def __init__(self, config: ECConfig = ECConfig(), env=None, env_params=None, mesh=None):
        """`mesh`: a 1-D `jax.sharding.Mesh` with axis "pop" (default: every visible device);
        pop_size must be a multiple of its size."""
        super().__init__(config, env, env_params)
        self.mesh = population_mesh() if mesh is None else mesh
        self.check_mesh()
        self.model, _, _ = make_vmap_mlp(self.obs_dim, self.act_dim, config.hidden, config.activation)
        self.head, self.head_target = self._head(config.policy_output)
        flat, self.unravel = flat_init(self.model, jax.random.key(0), self.obs_dim)
        self.num_params = flat.shape[0]
        self.strategy = self.make_strategy(flat)
        self.episodes = TrainingWrapper(self.env, config.episodes_per_individual, config.vmap_step)
        self._demos = None   # the MPC's (observations, actions) for init="operator", made when first needed
        if config.init == "operator" or config.init_augment:
            from evogrid.baselines.operators import decides_per_observation, has_mpc

            if config.init == "operator" and not has_mpc(self.env, self.env_params):
                raise ValueError(f"init='operator' fits the policy to the operator's MPC, which {config.task} does not "
                                 "have (the transmission tasks and dso-case33bw do); use init='random'")
            if config.init_augment and (config.init != "operator" or not decides_per_observation(self.env, self.env_params)):
                raise ValueError("init_augment adds perturbed MPC decisions to the fit of init='operator', on dso tasks "
                                 f"only (the feeder MPC decides from one observation); got init={config.init!r} on "
                                 f"{config.task}")

    # --- hooks ---------------------------------------------------------------------------
    info_sums: tuple[str, ...] = ()   # per-step info entries each individual's episodes also sum (`rollout`)

    def check_mesh(self):
        """Refuse a population that does not split evenly over `self.mesh`; set `self.block` (eval_block)."""
        config = self.config
        check_divisible(config.pop_size, self.mesh)
        share = config.pop_size // self.mesh.devices.size
        self.block = config.eval_block or share
        if share % self.block:
            raise ValueError(f"eval_block {config.eval_block} must divide each device's share of the population "
                             f"({share} = pop_size {config.pop_size} / {self.mesh.devices.size} devices)")

    def fitness(self, returns, costs, lagrangian: Lagrangian):
        """Fitness to maximise from mean episode returns [pop] and summed cost channels [pop, C]."""
        return lagrangian.penalise(returns, costs)

    def make_strategy(self, flat):
        """The population strategy (`init / ask / tell / center`) for the flattened initial parameters `flat`."""
        config = self.config
        if config.algorithm == "GA":
            return GeneticAlgorithm(config.pop_size, config.elite, config.sigma, config.mutation_rate)
        return EvosaxStrategy(config.algorithm, config.pop_size, flat, config.sigma, config.learning_rate)

    def tell(self, key, population, fitness, metrics, strategy_state):
        """Hand the evaluated population to the strategy (`metrics`: every individual's episode metrics)."""
        return self.strategy.tell(key, population, fitness, strategy_state)

    # --- workflow ----------------------------------------------------------------------
    def state_template(self):
        """`init()`'s state with the random start in place of the fit (same shapes): restoring a checkpoint does
        not solve the MPC's days or fit the policy again."""
        self.split_params(self.choice_split)
        return self._init(jax.random.key(self.config.seed), fitted=False)

    def initial_policy(self, key, fitted: bool = True):
        """(flat MLP parameters [D], observation statistics) the search starts from: random weights, or with
        `init="operator"` the MLP fitted (`networks.imitate`) to the operator's MPC played on the first
        `init_days` training days (`demonstrations`, through the env as the workflow plays it, layer
        included), with those days' observation statistics (with `policy_output="setpoint"`, fitted to the
        set-points the MPC's actions ask for)."""
        mean, _ = flat_init(self.model, key, self.obs_dim)
        norm = RunningNorm.create(self.obs_dim)
        if self.config.init == "random" or not fitted:
            return mean, norm
        obs, actions = self.demonstrations()
        obs, actions = jnp.asarray(obs, mean.dtype), jnp.asarray(actions, mean.dtype)
        if self.head_target is not None:   # the outputs that give the operator's actions
            actions = self.head_target(actions, obs)
        if self.config.obs_norm:
            norm = norm.update(obs)
            obs = norm.normalize(obs)
        params, _ = imitate(self.model, self.unravel(mean), obs, actions)
        return ravel_pytree(params)[0], norm

    def demonstrations(self):
        """(observations [N, obs_dim], actions [N, act_dim]) of the operator's MPC on the first `init_days`
        training days (cached on the workflow and on disk: a resumed or evaluated run does not solve them again)."""
        if self._demos is None:
            from evogrid.baselines import demonstrations

            days = range(min(self.config.init_days, self.env.num_days(self.env_params)))
            self._demos = demonstrations(self.env, self.env_params, days, self.config.init_augment)
        return self._demos

    def _init(self, key, fitted: bool = True) -> ECState:
        k_init, k_es, key = jax.random.split(key, 3)
        mean, norm = self.initial_policy(k_init, fitted)
        state = ECState(
            key=jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key,
            es_state=self.strategy.init(k_es, mean),
            obs_norm=norm,
            lagrangian=Lagrangian.create(len(self.cost_names), self.config, mean.dtype),
            generation=jnp.zeros((), jnp.int32),
            best_params=mean,
            best_obs_norm=norm,
            chosen=self.new_chosen(mean.dtype),
        )
        return replicate(state, self.mesh)  # the state lives replicated on the mesh

    def _head(self, output: str):
        """(head(out, obs) -> action after the MLP, its inverse target(action, obs) -> out); (None, None) for
        'action'."""
        if output == "action":
            return None, None
        from evogrid.envs.trans import TransGridEnv, setpoint_output, setpoint_output_action
        from evogrid.safety import Shielded

        if not isinstance(self.env.env if isinstance(self.env, Shielded) else self.env, TransGridEnv):
            raise ValueError(f"policy_output='setpoint' outputs the units' set-points, on transmission tasks (tso-*) "
                             f"only; {self.config.task} has no units to dispatch: use policy_output='action'")
        params = self.env_params   # the grid's constants (Pmin, Pmax, ramps), the same on every split
        return (lambda out, obs: setpoint_output_action(out, obs, params),
                lambda action, obs: setpoint_output(action, obs, params))

    def _policy(self, flat_params, norm: RunningNorm):
        params = self.unravel(flat_params)

        def act(obs):
            out = self.model.apply(params, norm.normalize(obs) if self.config.obs_norm else obs)
            return out if self.head is None else self.head(out, obs)

        return act

    def _play(self, flat_params, key, norm, batch_env):
        metrics, _ = rollout(batch_env, self._policy(flat_params, norm), key, self.env_params.max_steps, self.env_params,
                             obs_moments=self.config.obs_norm, info_sums=self.info_sums)
        return metrics

    def _play_population(self, population, key, norm):
        """Metrics of every individual ([pop, ...], replicated): each device plays its slice of the
        population in blocks, then an explicit all-gather hands every device the whole result (so
        no reduction over the population can be split across devices by the partitioner)."""
        def play(pop):
            return jax.vmap(self._play, in_axes=(0, None, None, None))(pop, key, norm, self.episodes)

        if not self.config.eval_block and self.mesh.devices.size == 1:
            return play(population)  # one device, one block: the plain vmap (fastest)

        def local(pop):
            if not self.config.eval_block:
                return play(pop)
            # fixed blocks: the same loop program on any device count
            out = jax.lax.map(play, pop.reshape(-1, self.block, pop.shape[-1]))
            return jax.tree_util.tree_map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), out)

        return split_and_gather(local, self.mesh, population)

    def _step(self, state: ECState):
        key = jax.random.wrap_key_data(state.key)
        key, k_ask, k_eval, k_tell = jax.random.split(key, 4)
        population, es_state = self.strategy.ask(k_ask, state.es_state)
        # pinned replicated: otherwise the partitioner propagates the rollout's split of the population
        # into the ES update and splits its sums over individuals across devices (other rounding)
        population = gather(population, self.mesh)
        metrics = self._play_population(population, k_eval, state.obs_norm)
        # every reduction below sees the whole population, in the same order on every device
        returns = metrics["episode_return"].mean(-1)          # [pop]
        costs = metrics["episode_cost"].mean(-2)              # [pop, C]
        fitness = self.fitness(returns, costs, state.lagrangian)
        es_state = self.tell(k_tell, population, fitness, metrics, es_state)
        # every `select_every` generations the distribution's centre and this generation's fittest member
        # are played on the validation days; the best of them and the policy kept so far is kept
        due = (state.generation % self.config.select_every == 0)
        candidates = jnp.stack([self.strategy.center(es_state), population[jnp.argmax(fitness)]])
        best = jax.lax.cond(due, lambda: self._select(state, candidates),
                            lambda: (state.best_params, state.best_obs_norm, state.chosen))
        norm = pool_moments(state.obs_norm, metrics) if self.config.obs_norm else state.obs_norm
        lagrangian = state.lagrangian.update(costs.mean(0), returns.mean(), self.config)
        state = state.replace(
            key=jax.random.key_data(key), es_state=es_state, obs_norm=norm, lagrangian=lagrangian,
            generation=state.generation + 1, best_params=best[0], best_obs_norm=best[1], chosen=best[2],
        )
        out = {
            "fitness_max": fitness.max(), "fitness_mean": fitness.mean(), "return": returns.mean(),
            "return_max": returns.max(), "cost_total": costs.sum(-1).mean(), "cost_channels": costs.mean(0),
            "multiplier": lagrangian.multiplier, **state.chosen.metrics(),
            "env_steps": (state.generation * self.config.pop_size * self.config.episodes_per_individual
                          * self.env_params.max_steps).astype(jnp.float32),
        }
        return state, out

    def _select(self, state: ECState, candidates):
        """Keep the best of `candidates` [K, D] and the policy kept so far on the validation days (`Chosen`)."""
        ret, day_cost = jax.vmap(lambda p: self.validation_score(self._policy(p, state.obs_norm)))(candidates)
        k, chosen = state.chosen.consider(ret, day_cost, state.lagrangian.weights())
        params = jnp.where(k >= 0, candidates[jnp.maximum(k, 0)], state.best_params)
        return params, tree_where(k >= 0, state.obs_norm, state.best_obs_norm), chosen

    def play_members(self, flat_params, norm, info_sums=()):
        """Each policy of `flat_params` [M, D] (with observation statistics `norm`) on every test day, one after
        another (`lax.map`), as `evaluate` plays its policy: `rollout` metrics [M, n_days, ...] (with `info_sums`).
        Archives and fronts report their members with it."""
        params, key = self.split_params("test"), jax.random.key(EVAL_SEED)
        return jax.lax.map(lambda flat: play_days(self.env, params, self._policy(flat, norm), key=key, info_sums=info_sums),
                           flat_params)

    def _evaluate(self, state: ECState):
        """The policy chosen on the validation days, on every test day."""
        return self.evaluate_policy(self.chosen_policy(state))

    def chosen_policy(self, state: ECState):
        return self._policy(state.best_params, state.best_obs_norm)
