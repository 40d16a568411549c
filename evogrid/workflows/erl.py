"""ERL hybrids: a population strategy and a TD3 learner that help each other; one generation per compiled call.

* ERL (Khadka & Tumer 2018): a GA population (`GeneticAlgorithm`) and a TD3 learner share one
  replay buffer filled by every actor's episodes (the learner's own with exploration noise);
  every `inject_every` generations the learner's actor replaces the worst member of the
  evaluated population before reproduction.
* CEM-RL (Pourchot & Sigaud 2019): a diagonal CEM distribution (`CEM`) over actor parameters;
  half of each sampled population takes `actor_steps` gradient steps on the TD3 critic before
  evaluation; the critic trains on the shared buffer; the distribution moves to the weighted elites.

Both are the same loop over algorithms from `evogrid.algorithms`: ask the strategy, play every
actor's episodes with `collect`, add them to the learner's buffer, train the critic, tell the
strategy. Actors are the TD3 actor network (tanh outputs), flattened to vectors for the
evolutionary side. Fitness = the return penalised by the constraint mechanism (evogrid.constraints).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

from evogrid.algorithms import CEM, TD3, GeneticAlgorithm, TD3Hyperparams, inject
from evogrid.constraints import ConstraintConfig, Lagrangian
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.networks import flat_init
from evogrid.rollout import collect
from evogrid.utils.config import param
from evogrid.utils.jax_utils import tree_where
from evogrid.workflows.base import Chosen, Workflow

ERL_ALGORITHMS = ("erl", "cemrl")


@dataclasses.dataclass(frozen=True)
class ERLConfig(ConstraintConfig, TD3Hyperparams):
    """An ERL or CEM-RL run: the TD3 learner's hyper-parameters plus the population's."""

    task: str = param("tso-case14", "task name (see `evogrid tasks`)")
    algorithm: str = param("erl", "hybrid: erl (GA + TD3) or cemrl (CEM + TD3)", choices=ERL_ALGORITHMS)
    pop_size: int = param(10, "population size (plus the learner)", lo=2, cli="--pop")
    episodes: int = param(1, "episodes per actor per generation", lo=1, cli="--episodes")
    hidden: tuple[int, ...] = param((64, 64), "actor and critic hidden layer widths", lo=1)
    updates_per_iter: int = param(96, "TD3 critic (and delayed actor) steps per generation", lo=1)
    eval_episodes: int = param(16, "evaluation episodes of tasks without days (gymnax); day tasks play every test day", lo=1)
    select_every: int = param(5, "generations between re-evaluations of candidate policies on the validation days", lo=1)
    seed: int = param(0, "random seed", lo=0)
    # ERL
    elite: int = param(2, "ERL: members copied unchanged", lo=0)
    mutation_sigma: float = param(0.05, "ERL: mutation std", lo=0.0, lo_open=True)
    mutation_rate: float = param(0.2, "ERL: share of parameters mutated", lo=0.0, hi=1.0)
    inject_every: int = param(5, "ERL: generations between injections of the learner", lo=1)
    # CEM-RL
    cem_sigma: float = param(0.05, "CEM-RL: initial std of the parameter distribution", lo=0.0, lo_open=True)
    cem_sigma_floor: float = param(1e-3, "CEM-RL: std floor", lo=0.0)
    elite_frac: float = param(0.5, "CEM-RL: share of the population that moves the mean", lo=0.0, hi=1.0, lo_open=True)
    actor_steps: int = param(48, "CEM-RL: critic-guided gradient steps for half of the population", lo=0)

    def _check(self):
        if self.elite >= self.pop_size:
            raise ValueError(f"elite must be in [0, pop_size - 1] = [0, {self.pop_size - 1}], got {self.elite}")


@struct.dataclass
class ERLState:
    learner: Any               # TD3State: actor, critics, targets, optimisers, the shared buffer
    strategy: Any              # GAState (ERL) or CEMState (CEM-RL)
    population: jnp.ndarray    # [pop, D] the last evaluated population
    fitness: jnp.ndarray       # [pop] its fitness (-inf before the first evaluation)
    lagrangian: Lagrangian
    key: jnp.ndarray
    generation: jnp.ndarray
    best: jnp.ndarray          # [D] the actor chosen on the validation days (flattened)
    chosen: Chosen             # its validation record (base.Chosen)


class ERLWorkflow(Workflow):
    """ERL or CEM-RL (`config.algorithm`) on a task."""

    config_type = ERLConfig

    def __init__(self, config: ERLConfig = ERLConfig(), env=None, env_params=None):
        super().__init__(config, env, env_params)
        hyper = {f.name: getattr(config, f.name) for f in dataclasses.fields(TD3Hyperparams)}
        self.td3 = TD3(TD3Hyperparams(**hyper), self.obs_dim, self.act_dim, len(self.cost_names), config.hidden)
        _, self.unravel = flat_init(self.td3.actor, jax.random.key(0), self.obs_dim)
        if config.algorithm == "erl":
            self.strategy = GeneticAlgorithm(config.pop_size, config.elite, config.mutation_sigma, config.mutation_rate)
        else:
            self.strategy = CEM(config.pop_size, config.cem_sigma, config.cem_sigma_floor, config.elite_frac)
        self.actors = TrainingWrapper(self.env, (config.pop_size + 1) * config.episodes)

    def _init(self, key) -> ERLState:
        k_rl, k_pop, key = jax.random.split(key, 3)
        learner = self.td3.init(k_rl)
        flat, _ = ravel_pytree(learner.actor)
        if self.config.algorithm == "erl":  # GA: independently initialised actors
            keys = jax.random.split(k_pop, self.config.pop_size)
            pop = jax.vmap(lambda k: ravel_pytree(self.td3.actor.init(k, jnp.zeros((self.obs_dim,))))[0])(keys)
            strategy = self.strategy.tell(None, pop, jnp.full((self.config.pop_size,), -jnp.inf, flat.dtype), None)
        else:  # CEM: a distribution around the learner's initial actor
            strategy = self.strategy.init(k_pop, flat)
        return ERLState(learner=learner, strategy=strategy, population=jnp.zeros((self.config.pop_size,) + flat.shape),
                        fitness=jnp.full((self.config.pop_size,), -jnp.inf, flat.dtype),
                        lagrangian=Lagrangian.create(len(self.cost_names), self.config, flat.dtype),
                        key=jax.random.key_data(key), generation=jnp.zeros((), jnp.int32), best=flat,
                        chosen=self.new_chosen(flat.dtype))

    def _play(self, state: ERLState, actors, key):
        """Every actor ([A, D] flat) plays `episodes` episodes; the last actor (the learner's) with
        exploration noise. Returns (fitness [A], returns [A], costs [A, C], transitions [T, A * E])."""
        cfg = self.config
        n_act = actors.shape[0]
        per_env = jnp.repeat(actors, cfg.episodes, axis=0)                    # [A * E, D]
        noisy = (jnp.arange(n_act * cfg.episodes) >= (n_act - 1) * cfg.episodes)[:, None]
        k_reset, k_roll = jax.random.split(key)

        def policy(k, obs):
            act = jax.vmap(lambda p, o: self.td3.actor.apply(self.unravel(p), o))(per_env, obs)
            noise = cfg.expl_noise * jax.random.normal(k, act.shape, act.dtype) * noisy
            return jnp.clip(act + noise, -1.0, 1.0), None

        obs, env_state = self.actors.reset(k_reset, self.env_params)
        _, _, traj, _ = collect(self.actors, self.env_params, policy, k_roll, env_state, obs, self.env_params.max_steps,
                                reset=False)
        returns = traj.reward.sum(0).reshape(n_act, cfg.episodes).mean(1)
        costs = traj.costs.sum(0).reshape(n_act, cfg.episodes, -1).mean(1)
        return state.lagrangian.penalise(returns, costs), returns, costs, traj

    def _critic_steps(self, learner, flat, key):
        """`actor_steps` gradient steps of one flat actor on -Q1(s, actor(s)) over replay batches."""
        opt = optax.adam(self.config.learning_rate)

        def step(carry, k):
            p, o = carry
            b = learner.buffer.sample(k, self.config.batch_size)

            def loss(q):
                return -jnp.mean(self.td3.q(learner.critic, b["obs"], self.td3.actor.apply(self.unravel(q), b["obs"]))[0])

            upd, o = opt.update(jax.grad(loss)(p), o, p)
            return (optax.apply_updates(p, upd), o), None

        (new, _), _ = jax.lax.scan(step, (flat, opt.init(flat)), jax.random.split(key, self.config.actor_steps))
        return jnp.where(self.td3.ready(learner), new, flat)

    def _step(self, state: ERLState):
        cfg = self.config
        key = jax.random.wrap_key_data(state.key)
        key, k_ask, k_actor, k_play, k_train, k_tell = jax.random.split(key, 6)
        learner = state.learner
        pop, strategy = self.strategy.ask(k_ask, state.strategy)
        if cfg.algorithm == "cemrl" and cfg.actor_steps:  # half of the population follows the critic first
            half = cfg.pop_size // 2
            trained = jax.vmap(lambda p, k: self._critic_steps(learner, p, k))(pop[:half], jax.random.split(k_actor, half))
            pop = pop.at[:half].set(trained)
        # the learner's actor plays last (ERL: the learner itself; CEM-RL: the distribution mean)
        rl_flat = ravel_pytree(learner.actor)[0] if cfg.algorithm == "erl" else strategy.mean
        fitness, returns, costs, traj = self._play(state, jnp.concatenate([pop, rl_flat[None]]), k_play)
        learner, losses = self.td3.train(self.td3.add(learner, traj), k_train, cfg.updates_per_iter, state.lagrangian)
        fit = fitness[:-1]
        metrics = {}
        if cfg.algorithm == "erl":
            do_inject = (state.generation + 1) % cfg.inject_every == 0
            ga = tree_where(do_inject, inject(strategy.replace(population=pop, fitness=fit), rl_flat, fitness[-1]),
                            strategy.replace(population=pop, fitness=fit))
            pop, fit = ga.population, ga.fitness
            strategy = self.strategy.tell(k_tell, pop, fit, strategy)
            metrics = {"rl_fitness": fitness[-1], "injected": do_inject.astype(jnp.float32)}
        else:
            strategy = self.strategy.tell(k_tell, pop, fit, strategy)
            metrics = {"sigma_mean": jnp.sqrt(strategy.var).mean()}
        lagrangian = state.lagrangian.update(costs.mean(0), returns.mean(), cfg)
        # the population's fittest member and the learner's actor against the actor kept so far, on validation days
        candidates = jnp.stack([pop[jnp.argmax(fit)], rl_flat])
        best, chosen = jax.lax.cond(state.generation % cfg.select_every == 0, lambda: self._select(state, candidates),
                                    lambda: (state.best, state.chosen))
        new = state.replace(learner=learner, strategy=strategy, population=pop, fitness=fit, lagrangian=lagrangian,
                            key=jax.random.key_data(key), generation=state.generation + 1, best=best, chosen=chosen)
        metrics.update(chosen.metrics())
        n_played = (cfg.pop_size + 1) * cfg.episodes * self.env_params.max_steps
        return new, {"fitness_max": fit.max(), "fitness_mean": fit.mean(), "return": returns.mean(),
                     "cost_total": costs.sum(-1).mean(), "cost_channels": costs.mean(0),
                     "multiplier": lagrangian.multiplier, **losses, **metrics,
                     "env_steps": (new.generation * n_played).astype(jnp.float32)}

    def _actor(self, flat):
        return lambda obs: self.td3.actor.apply(self.unravel(flat), obs)

    def _select(self, state: ERLState, candidates):
        ret, day_cost = jax.vmap(lambda p: self.validation_score(self._actor(p)))(candidates)
        k, chosen = state.chosen.consider(ret, day_cost, state.lagrangian.weights())
        return jnp.where(k >= 0, candidates[jnp.maximum(k, 0)], state.best), chosen

    def _evaluate(self, state: ERLState):
        """The actor chosen on the validation days (the learner's initial actor before any choice), on every test day."""
        return self.evaluate_policy(self.chosen_policy(state))

    def chosen_policy(self, state: ERLState):
        return self._actor(state.best)
