"""ECWorkflow: evolve MLP policies with an evosax strategy or a native GA.

One generation is one compiled call: ask -> population [pop, D] of flattened
MLP parameters -> `jit(vmap(rollout))` over the population (each individual
plays the same `episodes_per_individual` episodes, common random numbers, in a
`TrainingWrapper`; episodes run to the horizon without per-step resets) ->
fitness -> tell. Fitness is maximised; evosax minimises, and the sign flip
lives in one place, `EvosaxStrategy.tell`.

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
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

from evogrid.envs import make
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.networks import RunningNorm, make_vmap_mlp
from evogrid.operators import MLPMutation, elite_indices, tournament_selection, uniform_crossover
from evogrid.rollout import rollout
from evogrid.utils.jax_utils import strong_types, tree_where
from evogrid.utils.sharding import POP_AXIS, check_divisible, gather, population_mesh, replicate
from evogrid.workflows.base import ConfigMixin, Workflow

EVOSAX_ALGORITHMS = ("Open_ES", "CMA_ES", "Sep_CMA_ES", "SNES", "xNES", "PGPE", "ARS", "SimpleGA")
ALGORITHMS = EVOSAX_ALGORITHMS + ("GA",)


@dataclasses.dataclass(frozen=True)
class ECConfig(ConfigMixin):
    """Static structure and hyperparameters of an EC run (all of it is recorded with checkpoints)."""

    task: str = "tso-case14"
    algorithm: str = "Open_ES"
    pop_size: int = 64
    episodes_per_individual: int = 2
    hidden: tuple[int, ...] = (32, 32)
    activation: str = "tanh"
    sigma: float = 0.05             # initial search std (ES) / mutation scale (GA)
    learning_rate: float = 0.03     # ES optimiser (Open_ES, SNES, xNES, PGPE, ARS)
    cost_penalty: float = 0.0       # lambda in fitness = return - lambda * summed costs
    obs_norm: bool = True
    vmap_step: bool = True
    eval_episodes: int = 16
    eval_block: int = 0             # individuals evaluated together; 0 = each device's whole share (see below)
    elite: int = 4                  # GA: members copied unchanged
    mutation_rate: float = 1.0      # GA: share of parameters perturbed
    seed: int = 0

    def __post_init__(self):
        self._check(ALGORITHMS, "")
        for name in ("pop_size", "episodes_per_individual", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.algorithm in ("Open_ES", "PGPE", "ARS") and self.pop_size % 2:
            raise ValueError(f"{self.algorithm} samples antithetic pairs: pop_size must be even, got {self.pop_size}")
        if self.algorithm == "GA" and not 0 <= self.elite < self.pop_size:
            raise ValueError(f"elite must be in [0, pop_size), got {self.elite}")
        if self.eval_block < 0 or (self.eval_block and self.pop_size % self.eval_block):
            raise ValueError(f"eval_block must be 0 or divide pop_size {self.pop_size}, got {self.eval_block}")
        if self.sigma <= 0 or self.learning_rate <= 0 or self.cost_penalty < 0:
            raise ValueError("sigma and learning_rate must be > 0 and cost_penalty >= 0")




@struct.dataclass
class ECState:
    key: jnp.ndarray            # uint32 key data (checkpoint friendly)
    es_state: Any
    obs_norm: RunningNorm
    generation: jnp.ndarray     # int32
    best_params: jnp.ndarray    # [D] flattened MLP parameters of the fittest individual so far
    best_fitness: jnp.ndarray
    best_obs_norm: RunningNorm  # the observation statistics it was evaluated with


class EvosaxStrategy:
    """Adapter over an evosax 0.3 algorithm: flat [D] solutions, fitness maximised."""

    def __init__(self, name: str, pop_size: int, template, sigma: float, learning_rate: float):
        # imported here: importing evosax.algorithms creates arrays, which would start the XLA backend
        # before `evogrid train --distributed` can call jax.distributed.initialize
        import evosax.algorithms as ea

        cls = getattr(ea, name)
        accepted = inspect.signature(cls.__init__).parameters
        kwargs = {}
        if "optimizer" in accepted:
            kwargs["optimizer"] = optax.adam(learning_rate)
        if "std_schedule" in accepted:
            kwargs["std_schedule"] = optax.constant_schedule(sigma)
        self.es = cls(population_size=pop_size, solution=template, **kwargs)
        params = self.es.default_params
        if hasattr(params, "std_init"):
            params = params.replace(std_init=jnp.asarray(sigma, template.dtype))
        self.params = params
        self.population_based = isinstance(self.es, ea.population_based.base.PopulationBasedAlgorithm)
        self.sigma = sigma

    def init(self, key, mean):
        if self.population_based:
            k1, k2 = jax.random.split(key)
            pop = mean + self.sigma * jax.random.normal(k1, (self.es.population_size, mean.shape[0]), mean.dtype)
            return strong_types(self.es.init(k2, pop, jnp.full((self.es.population_size,), jnp.inf, mean.dtype), self.params))
        return strong_types(self.es.init(key, mean, self.params))

    def ask(self, key, state):
        population, new = self.es.ask(key, state, self.params)
        return population, strong_types(new, like=state)

    def tell(self, key, population, fitness, state):
        new, _ = self.es.tell(key, population, -fitness, state, self.params)  # the one sign flip: evosax minimises
        # evosax returns some fields weak-typed (e.g. a schedule's std); keep the input's exact
        # types so a jitted step does not retrace at generation 2
        return strong_types(new, like=state)

    def center(self, state):
        return state.best_solution if self.population_based else state.mean


@struct.dataclass
class GAState:
    population: jnp.ndarray  # [pop, D]
    fitness: jnp.ndarray     # [pop], -inf before the first evaluation


class NativeGA:
    """Elitist GA from `evogrid.operators`: tournament parents, uniform crossover, Gaussian mutation."""

    def __init__(self, pop_size: int, elite: int, sigma: float, mutation_rate: float):
        self.pop_size, self.elite = pop_size, elite
        self.mutation = MLPMutation(rate=mutation_rate, scale=sigma)
        self.sigma = sigma

    def init(self, key, mean):
        pop = mean + self.sigma * jax.random.normal(key, (self.pop_size, mean.shape[0]), mean.dtype)
        return GAState(pop, jnp.full((self.pop_size,), -jnp.inf, mean.dtype))

    def ask(self, key, state: GAState):
        k_sel, k_cross, k_mut = jax.random.split(key, 3)
        n_child = self.pop_size - self.elite
        parents = tournament_selection(k_sel, state.fitness, 2 * n_child).reshape(2, n_child)
        cross_keys = jax.random.split(k_cross, n_child)
        children = jax.vmap(uniform_crossover)(cross_keys, state.population[parents[0]], state.population[parents[1]])
        children = self.mutation.mutate_population(k_mut, children)
        elites = state.population[elite_indices(state.fitness, self.elite)]
        offspring = jnp.concatenate([elites, children])
        first = jnp.all(jnp.isneginf(state.fitness))  # evaluate the initial population as it is
        return jnp.where(first, state.population, offspring), state

    def tell(self, key, population, fitness, state):
        return GAState(population, fitness)

    def center(self, state: GAState):
        return state.population[jnp.argmax(state.fitness)]


class ECWorkflow(Workflow):
    """Evolve an MLP policy for `config.task` (or for an env/params you pass).

    Subclass and override `fitness(returns, costs)` to change what is maximised
    (see examples/cost_constrained_es.py).
    """

    def __init__(self, config: ECConfig = ECConfig(), env=None, env_params=None, mesh=None):
        """`mesh`: a 1-D `jax.sharding.Mesh` with axis "pop" (default: every visible device);
        pop_size must be a multiple of its size."""
        self.config = config
        self.mesh = population_mesh() if mesh is None else mesh
        check_divisible(config.pop_size, self.mesh)
        share = config.pop_size // self.mesh.devices.size
        self.block = config.eval_block or share
        if share % self.block:
            raise ValueError(f"eval_block {config.eval_block} must divide each device's share of the population "
                             f"({share} = pop_size {config.pop_size} / {self.mesh.devices.size} devices)")
        if env is None:
            env, env_params = make(config.task)
        self.env, self.env_params = env, env_params
        obs_dim = env.observation_space(env_params).shape[0]
        self.act_dim = env.action_space(env_params).shape[0]
        self.n_costs = env.num_constraints(env_params)
        self.model, _, _ = make_vmap_mlp(obs_dim, self.act_dim, config.hidden, config.activation)
        template = self.model.init(jax.random.key(0), jnp.zeros((obs_dim,)))
        flat, self.unravel = ravel_pytree(template)
        self.num_params = flat.shape[0]
        if config.algorithm == "GA":
            self.strategy = NativeGA(config.pop_size, config.elite, config.sigma, config.mutation_rate)
        else:
            self.strategy = EvosaxStrategy(config.algorithm, config.pop_size, flat, config.sigma, config.learning_rate)
        self.episodes = TrainingWrapper(env, config.episodes_per_individual, config.vmap_step)
        self.eval_env = TrainingWrapper(env, config.eval_episodes, config.vmap_step)
        self.obs_dim = obs_dim

    def config_dict(self) -> dict:
        return self.config.to_dict()

    # --- hooks ---------------------------------------------------------------------------
    def fitness(self, returns, costs):
        """Fitness to maximise from mean episode returns [pop] and summed cost channels [pop, C]."""
        return returns - self.config.cost_penalty * costs.sum(-1)

    # --- workflow ----------------------------------------------------------------------
    def init(self, key=None) -> ECState:
        key = jax.random.key(self.config.seed) if key is None else key
        k_init, k_es, key = jax.random.split(key, 3)
        mean, _ = ravel_pytree(self.model.init(k_init, jnp.zeros((self.obs_dim,))))
        es_state = self.strategy.init(k_es, mean)
        state = ECState(
            key=jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key,
            es_state=es_state,
            obs_norm=RunningNorm.create(self.obs_dim),
            generation=jnp.zeros((), jnp.int32),
            best_params=mean,
            best_fitness=jnp.asarray(-jnp.inf, mean.dtype),
            best_obs_norm=RunningNorm.create(self.obs_dim),
        )
        return replicate(state, self.mesh)  # the state lives replicated on the mesh

    def _policy(self, flat_params, norm: RunningNorm):
        params = self.unravel(flat_params)

        def act(obs):
            return self.model.apply(params, norm.normalize(obs) if self.config.obs_norm else obs)

        return act

    def _play(self, flat_params, key, norm, batch_env):
        metrics, _ = rollout(batch_env, self._policy(flat_params, norm), key, self.env_params.max_steps, self.env_params,
                             obs_moments=self.config.obs_norm)
        return metrics

    def _play_population(self, population, key, norm):
        """Metrics of every individual ([pop, ...], replicated): each device plays its slice of the
        population in blocks, then an explicit all-gather hands every device the whole result (so
        no reduction over the population can be split across devices by the partitioner)."""
        P = jax.sharding.PartitionSpec

        def play(pop):
            return jax.vmap(self._play, in_axes=(0, None, None, None))(pop, key, norm, self.episodes)

        if not self.config.eval_block and self.mesh.devices.size == 1:
            return play(population)  # one device, one block: the plain vmap (fastest)

        def local(pop):
            if self.config.eval_block:  # fixed blocks: the same loop program on any device count
                out = jax.lax.map(play, pop.reshape(-1, self.block, pop.shape[-1]))
                out = jax.tree_util.tree_map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), out)
            else:
                out = play(pop)
            return jax.lax.all_gather(out, POP_AXIS, tiled=True)

        # no other collectives inside: check_vma=False lets replicated inputs (key, norm) seed per-device scans
        return jax.shard_map(local, mesh=self.mesh, in_specs=P(POP_AXIS), out_specs=P(), check_vma=False)(population)

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
        fitness = self.fitness(returns, costs)
        es_state = self.strategy.tell(k_tell, population, fitness, es_state)
        i_best = jnp.argmax(fitness)
        improved = fitness[i_best] > state.best_fitness
        best_norm = tree_where(improved, state.obs_norm, state.best_obs_norm)
        norm = state.obs_norm
        if self.config.obs_norm:
            w = metrics["obs_count"] / metrics["obs_count"].sum()  # pool the individuals' moments by count
            mean = jnp.einsum("p,pd->d", w, metrics["obs_mean"])
            var = jnp.einsum("p,pd->d", w, metrics["obs_var"] + metrics["obs_mean"] ** 2) - mean**2
            norm = norm.merge(mean, jnp.maximum(var, 0.0), metrics["obs_count"].sum())
        state = state.replace(
            key=jax.random.key_data(key), es_state=es_state, obs_norm=norm, generation=state.generation + 1,
            best_params=jnp.where(improved, population[i_best], state.best_params),
            best_fitness=jnp.where(improved, fitness[i_best], state.best_fitness), best_obs_norm=best_norm,
        )
        out = {
            "fitness_max": fitness.max(), "fitness_mean": fitness.mean(), "fitness_min": fitness.min(),
            "return_mean": returns.mean(), "cost_mean": costs.sum(-1).mean(), "cost_channels": costs.mean(0),
            "best_fitness": state.best_fitness,
        }
        return state, out

    def _evaluate(self, state: ECState):
        """Mean return and costs over `eval_episodes` fresh episodes of the best individual so far
        (with the observation statistics it was selected under)."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), 7)
        metrics = self._play(state.best_params, key, state.best_obs_norm, self.eval_env)
        return {"return": metrics["episode_return"].mean(), "return_std": metrics["episode_return"].std(),
                "cost_channels": metrics["episode_cost"].mean(0)}
