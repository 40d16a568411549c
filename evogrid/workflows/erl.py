"""ERL hybrids: a population and a TD3 learner that help each other; one generation per compiled call.

* ERL (Khadka & Tumer 2018): a GA population (`NativeGA`: elitism, tournament, uniform crossover,
  Gaussian mutation) and a TD3 learner share one replay buffer filled by every actor's episodes
  (the learner's own with exploration noise); every `inject_every` generations the learner's actor
  replaces the worst member of the evaluated population before reproduction.
* CEM-RL (Pourchot & Sigaud 2019): a diagonal CEM distribution over actor parameters; half of each
  sampled population takes `actor_steps` gradient steps on the TD3 critic before evaluation; the
  critic trains on the shared buffer; the distribution moves to the weighted elites.

Actors are the TD3 actor network (tanh outputs), flattened to vectors for the evolutionary side.
Fitness = mean episode return (minus lambda x costs when `cost_budget` is set, with the same dual
ascent as RLWorkflow).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

from evogrid.utils.jax_utils import tree_where
from evogrid.workflows.base import Workflow
from evogrid.workflows.ec import GAState, NativeGA
from evogrid.workflows.rl import GradientConfig, RLConfig, RLState, RLWorkflow

ERL_ALGORITHMS = ("erl", "cemrl")


@dataclasses.dataclass(frozen=True)
class ERLConfig(GradientConfig):
    task: str = "tso-case5"
    algorithm: str = "erl"
    pop_size: int = 10
    episodes: int = 1                # per actor per generation
    hidden: tuple[int, ...] = (64, 64)
    updates_per_gen: int = 96        # TD3 critic (and delayed actor) steps per generation
    # ERL
    elite: int = 2
    mutation_sigma: float = 0.05
    mutation_rate: float = 0.2
    inject_every: int = 5
    # CEM-RL
    cem_sigma: float = 0.05          # initial std of the parameter distribution
    cem_sigma_floor: float = 1e-3
    elite_frac: float = 0.5
    actor_steps: int = 48            # critic-guided gradient steps for half of the population

    def __post_init__(self):
        self._check(ERL_ALGORITHMS, "ERL ")
        if self.pop_size < 2 or self.episodes < 1 or self.inject_every < 1:
            raise ValueError("need pop_size >= 2, episodes >= 1, inject_every >= 1")
        if not 0 <= self.elite < self.pop_size or not 0 < self.elite_frac <= 1:
            raise ValueError("need 0 <= elite < pop_size and 0 < elite_frac <= 1")




@struct.dataclass
class ERLState:
    learner: RLState           # TD3 actor/critics/targets/optimisers, shared buffer, multiplier
    population: jnp.ndarray    # ERL: [pop, D] flat actors; CEM-RL: the last sampled population
    fitness: jnp.ndarray       # [pop] of the last evaluation (-inf before the first)
    mean: jnp.ndarray          # CEM-RL distribution mean [D] (ERL: unused copy of actor 0)
    var: jnp.ndarray           # CEM-RL diagonal variance [D]
    key: jnp.ndarray
    generation: jnp.ndarray


def inject(population, fitness, actor, actor_fitness):
    """Replace the worst member (lowest fitness) by `actor`; returns (population, fitness)."""
    worst = jnp.argmin(fitness)
    return population.at[worst].set(actor), fitness.at[worst].set(actor_fitness)


class ERLWorkflow(Workflow):
    """ERL or CEM-RL (`config.algorithm`) on a task, with a TD3 learner from `RLWorkflow`."""

    def __init__(self, config: ERLConfig = ERLConfig(), env=None, env_params=None):
        self.config = config
        n_envs = (config.pop_size + 1) * config.episodes
        shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(GradientConfig)}
        rl = RLConfig(task=config.task, algorithm="td3", num_envs=n_envs, rollout_len=1, minibatches=1,
                      hidden=config.hidden, **shared)
        self.rl = RLWorkflow(rl, env, env_params)
        self.env, self.env_params = self.rl.env, self.rl.env_params
        _, self.unravel = ravel_pytree(self.rl.actor.init(jax.random.key(0), jnp.zeros((self.rl.obs_dim,))))
        self.ga = NativeGA(config.pop_size, config.elite, config.mutation_sigma, config.mutation_rate)

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def init(self, key=None) -> ERLState:
        key = jax.random.key(self.config.seed) if key is None else key
        k_rl, k_pop, key = jax.random.split(key, 3)
        learner = self.rl.init(k_rl)
        flat, _ = ravel_pytree(learner.actor)
        keys = jax.random.split(k_pop, self.config.pop_size)
        pop = jax.vmap(lambda k: ravel_pytree(self.rl.actor.init(k, jnp.zeros((self.rl.obs_dim,))))[0])(keys)
        var = jnp.full_like(flat, self.config.cem_sigma**2)
        return ERLState(learner=learner, population=pop, fitness=jnp.full((self.config.pop_size,), -jnp.inf, flat.dtype),
                        mean=flat, var=var, key=jax.random.key_data(key), generation=jnp.zeros((), jnp.int32))

    # --- shared pieces -----------------------------------------------------------------------
    def _play(self, learner: RLState, actors, key, noisy_last: bool):
        """Every actor ([A, D] flat) plays `episodes` full episodes; the last one with exploration
        noise when `noisy_last` (the learner). Returns (fitness [A], transitions, mean step costs)."""
        cfg = self.config
        n_act = actors.shape[0]
        per_env = jnp.repeat(actors, cfg.episodes, axis=0)                    # [A * E, D]
        noise_on = (jnp.arange(n_act * cfg.episodes) >= (n_act - 1) * cfg.episodes) & noisy_last
        k_reset, k_roll = jax.random.split(key)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(k_reset, per_env.shape[0]), self.env_params)

        def body(carry, k):
            obs, env_state = carry
            k_noise, k_env = jax.random.split(k)
            act = jax.vmap(lambda p, o: self.rl.actor.apply(self.unravel(p), o))(per_env, obs)
            noise = self.config.expl_noise * jax.random.normal(k_noise, act.shape) * noise_on[:, None]
            act = jnp.clip(act + noise, -1.0, 1.0)
            keys = jax.random.split(k_env, per_env.shape[0])
            step = jax.vmap(lambda kk, s, a: self.env.step_no_reset(kk, s, a, self.env_params))
            next_obs, env_state, reward, costs, done, _ = step(keys, env_state, act)
            terminated = done & (env_state.time_step < self.env_params.max_steps)
            tr = {"obs": obs, "action": act, "reward": reward, "costs": costs, "next_obs": next_obs,
                  "terminated": terminated.astype(reward.dtype)}
            return (next_obs, env_state), tr

        _, traj = jax.lax.scan(body, (obs, env_state), jax.random.split(k_roll, self.env_params.max_steps))
        score = traj["reward"].sum(0)
        if cfg.cost_budget is not None:
            score = score - learner.lam * traj["costs"].sum((0, 2))
        fitness = score.reshape(n_act, cfg.episodes).mean(1)
        flat = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:]), traj)
        return fitness, flat, traj["costs"].sum(-1).mean()

    def _train_critic(self, learner: RLState, key):
        ready = learner.buffer.size >= jnp.minimum(self.config.warmup_steps, self.config.buffer_size)

        def update(st, k):
            new, _ = self.rl.td3_update(st, k)
            return tree_where(ready, new, st), None

        learner, _ = jax.lax.scan(update, learner, jax.random.split(key, self.config.updates_per_gen))
        return learner

    # --- generations -------------------------------------------------------------------------
    def _step(self, state: ERLState):
        return self._erl(state) if self.config.algorithm == "erl" else self._cemrl(state)

    def _erl(self, state: ERLState):
        key = jax.random.wrap_key_data(state.key)
        key, k_play, k_train, k_ga = jax.random.split(key, 4)
        learner = state.learner
        rl_flat, _ = ravel_pytree(learner.actor)
        actors = jnp.concatenate([state.population, rl_flat[None]])
        fitness, transitions, step_cost = self._play(learner, actors, k_play, noisy_last=True)
        learner = learner.replace(buffer=learner.buffer.add(transitions))
        learner = self._train_critic(learner, k_train)
        pop, fit = state.population, fitness[:-1]
        do_inject = (state.generation + 1) % self.config.inject_every == 0
        injected = inject(pop, fit, rl_flat, fitness[-1])
        pop, fit = tree_where(do_inject, injected, (pop, fit))
        offspring, _ = self.ga.ask(k_ga, GAState(pop, fit))
        learner = learner.replace(lam=self.rl._update_lambda(learner, step_cost), iteration=learner.iteration + 1)
        new = state.replace(learner=learner, population=offspring, fitness=fit, key=jax.random.key_data(key),
                            generation=state.generation + 1)
        return new, {"fitness_max": fit.max(), "fitness_mean": fit.mean(), "rl_fitness": fitness[-1],
                     "injected": do_inject.astype(jnp.float32), "lambda": learner.lam,
                     "episode_cost": step_cost * self.env_params.max_steps}

    def _cemrl(self, state: ERLState):
        cfg = self.config
        key = jax.random.wrap_key_data(state.key)
        key, k_sample, k_actor, k_play, k_train = jax.random.split(key, 5)
        learner = state.learner
        eps = jax.random.normal(k_sample, (cfg.pop_size, state.mean.shape[0]), state.mean.dtype)
        pop = state.mean + jnp.sqrt(state.var) * eps
        half = cfg.pop_size // 2
        trained = jax.vmap(lambda p, k: self._critic_steps(learner, p, k))(pop[:half], jax.random.split(k_actor, half))
        pop = jnp.concatenate([trained, pop[half:]])
        mean_actor = self.unravel(state.mean)
        learner = learner.replace(actor=mean_actor)
        fitness, transitions, step_cost = self._play(learner, jnp.concatenate([pop, state.mean[None]]), k_play, noisy_last=True)
        fitness = fitness[:-1]
        learner = learner.replace(buffer=learner.buffer.add(transitions))
        learner = self._train_critic(learner, k_train)
        n_elite = max(1, int(round(cfg.elite_frac * cfg.pop_size)))
        order = jnp.argsort(-fitness)[:n_elite]
        w = jnp.log(n_elite + 1.0) - jnp.log(jnp.arange(1, n_elite + 1, dtype=fitness.dtype))
        w = w / w.sum()
        elites = pop[order]
        mean = w @ elites
        var = w @ (elites - state.mean) ** 2 + cfg.cem_sigma_floor**2
        learner = learner.replace(lam=self.rl._update_lambda(learner, step_cost), iteration=learner.iteration + 1)
        new = state.replace(learner=learner, population=pop, fitness=fitness, mean=mean, var=var,
                            key=jax.random.key_data(key), generation=state.generation + 1)
        return new, {"fitness_max": fitness.max(), "fitness_mean": fitness.mean(),
                     "trained_half_mean": fitness[:half].mean(), "sigma_mean": jnp.sqrt(var).mean(), "lambda": learner.lam,
                     "episode_cost": step_cost * self.env_params.max_steps}

    def _critic_steps(self, learner: RLState, flat, key):
        """`actor_steps` gradient steps of one flat actor on -Q1(s, actor(s)) over replay batches."""
        opt = optax.adam(self.config.learning_rate)
        ready = learner.buffer.size >= jnp.minimum(self.config.warmup_steps, self.config.buffer_size)

        def step(carry, k):
            p, o = carry
            b = learner.buffer.sample(k, self.config.batch_size)

            def loss(q):
                a = self.rl.actor.apply(self.unravel(q), b["obs"])
                return -jnp.mean(self.rl._q(learner.critic, b["obs"], a)[0])

            g = jax.grad(loss)(p)
            upd, o = opt.update(g, o, p)
            return (optax.apply_updates(p, upd), o), None

        (new, _), _ = jax.lax.scan(step, (flat, opt.init(flat)), jax.random.split(key, self.config.actor_steps))
        return jnp.where(ready, new, flat)

    def _evaluate(self, state: ERLState):
        """ERL: the best evaluated member; CEM-RL: the distribution mean; deterministic, fresh episodes."""
        if self.config.algorithm == "erl":
            best = jnp.where(jnp.all(jnp.isneginf(state.fitness)), ravel_pytree(state.learner.actor)[0],
                             state.population[0])  # NativeGA keeps elites first
        else:
            best = state.mean
        return self.rl._evaluate(state.learner.replace(actor=self.unravel(best)))
