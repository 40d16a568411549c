"""A security game: a dispatch population co-evolved against an attacker population that trips lines.

The operator is an MLP dispatch policy (obs -> unit set-points), as in `ECWorkflow`. The attacker is an
open-loop plan per day with a budget of k lines: a genome of one score per line that can be tripped
without islanding the grid and one start time per tripped line; the top-k scores name the lines, and
each stays out for `attack_steps` steps from its start. An attack is played by writing it into the
task's `outage_schedule` leaf, so the env's own outage physics (post-outage flows, line status in the
observation, N-1 screening of the grid as it is) applies unchanged.

Each generation pairs operator i with a shuffled attacker (as `CoevolutionWorkflow` pairs companies)
on `episodes` random training days. Operator fitness: return - `penalty` x the summed cost channels
(p.u.; a fixed penalty rather than the Lagrangian, since the adversary changes the problem every
generation). Attacker fitness: the damage, the operator's overload (`thermal`) and balance shortfall
(`balance`, the slack pushed beyond its limits: load the grid cannot serve as dispatched) summed over
the day. Both populations use the same evosax strategy.

`evaluate` plays the operator's distribution centre on every test day three ways: without outages,
under `random_attacks` random plans of the same budget, and under the evolved attacker's centre, and
reports return and damage of each (per day) with the lines the evolved attack trips.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.algorithms import EVOSAX_ALGORITHMS, EvosaxStrategy
from evogrid.algorithms.es import OPTIMISED
from evogrid.envs.trans import TransGridEnv
from evogrid.networks import flat_init, make_vmap_mlp
from evogrid.rollout import rollout
from evogrid.utils.config import Config, param, refuse_unused
from evogrid.workflows.base import EVAL_SEED, Workflow

DAMAGE = ("thermal", "balance")


@dataclasses.dataclass(frozen=True)
class AttackConfig(Config):
    task: str = param("tso-case14-n1", "DC transmission task with outages (tso-caseN-n1)")
    algorithm: str = param("attack", "operator vs line-tripping attacker co-evolution", choices=("attack",))
    strategy: str = param("Open_ES", "evolution strategy of both populations", choices=EVOSAX_ALGORITHMS)
    pop_size: int = param(32, "population size of each side (even)", lo=2, cli="--pop")
    episodes: int = param(2, "training days per operator-attacker pairing per generation", lo=1, cli="--episodes")
    budget: int = param(1, "lines the attacker trips per day (k)", lo=1)
    attack_steps: int = param(4, "steps a tripped line stays out", lo=1)
    penalty: float = param(10.0, "operator fitness: return - penalty x summed cost channels (p.u.)", lo=0.0)
    hidden: tuple[int, ...] = param((32,), "operator MLP hidden layer widths", lo=1)
    sigma: float = param(0.1, "initial search std (both sides)", lo=0.0, lo_open=True)
    learning_rate: float = param(0.05, "ES optimiser step size (both sides)", lo=0.0, lo_open=True, cli="--lr")
    random_attacks: int = param(16, "random attack plans per test day in the evaluation", lo=1)
    seed: int = param(0, "random seed", lo=0)

    def _check(self):
        if self.pop_size % 2:
            raise ValueError(f"pop_size must be even (antithetic sampling), got {self.pop_size}")
        refuse_unused(self, "strategy", {"learning_rate": OPTIMISED})


@struct.dataclass
class AttackState:
    key: jnp.ndarray        # uint32 key data
    operator: object        # evosax state of the dispatch policies
    attacker: object        # evosax state of the attack plans
    generation: jnp.ndarray


class AttackWorkflow(Workflow):

    config_type = AttackConfig
    def __init__(self, config: AttackConfig = AttackConfig(), env=None, env_params=None):
        super().__init__(config, env, env_params)
        p = self.env_params
        if not isinstance(self.env, TransGridEnv) or p.ac or p.outages is None:
            raise ValueError(f"the attack game needs a DC transmission task with line outages (tso-case14-n1, "
                             f"tso-case118-n1, or make(..., outages_per_day=...)), got {config.task!r}")
        self.candidates = np.flatnonzero(~np.asarray(p.outages.bridge))
        if config.budget > self.candidates.size:
            raise ValueError(f"budget {config.budget} is above the {self.candidates.size} lines of {config.task} "
                             "that can be tripped without islanding the grid")
        if config.attack_steps > p.max_steps:
            raise ValueError(f"attack_steps {config.attack_steps} is longer than the day ({p.max_steps} steps)")
        self.damage_idx = np.asarray([self.cost_names.index(n) for n in DAMAGE])
        self.model, _, _ = make_vmap_mlp(self.obs_dim, self.act_dim, config.hidden, "tanh")
        flat, self.unravel = flat_init(self.model, jax.random.key(0), self.obs_dim)
        self.num_params = flat.size
        self.operator = EvosaxStrategy(config.strategy, config.pop_size, flat, config.sigma, config.learning_rate)
        self.attack_dim = self.candidates.size + config.budget
        self.attacker = EvosaxStrategy(config.strategy, config.pop_size, jnp.zeros(self.attack_dim, flat.dtype),
                                       config.sigma, config.learning_rate)

    def metric_names(self) -> dict:
        return {"cost_channels": self.cost_names, "attack_lines": tuple(f"line_{i}" for i in range(self.config.budget))}

    def attack_plan(self, genome):
        """Genome [n_candidates + k] -> ([max_steps, k] outage schedule of the day, the k branch indices)."""
        k, steps = self.config.budget, self.env_params.max_steps
        scores, times = genome[: self.candidates.size], genome[self.candidates.size:]
        lines = jnp.asarray(self.candidates)[jnp.argsort(-scores)[:k]]
        last = steps - self.config.attack_steps
        start = jnp.clip(jnp.floor(0.5 * (jnp.tanh(times) + 1.0) * (last + 1)), 0, last).astype(jnp.int32)
        t = jnp.arange(steps)[:, None]
        active = (t >= start[None, :]) & (t < start[None, :] + self.config.attack_steps)
        return jnp.where(active, lines[None, :], -1).astype(jnp.int32), lines

    def _policy(self, flat):
        return lambda obs: self.model.apply(self.unravel(flat), obs)

    def _day(self, flat, genome, params, day, key):
        """(return, summed costs [C]) of the operator `flat` on `day` of `params` under the attack `genome`
        (None: no outages at all)."""
        plan = jnp.full((params.max_steps, 1), -1, jnp.int32) if genome is None else self.attack_plan(genome)[0]
        params = params.replace(outage_schedule=jnp.broadcast_to(plan, (params.load_p.shape[0],) + plan.shape))
        start = self.env.reset_to_day(day, params)
        metrics, _ = rollout(self.env, self._policy(flat), key, params.max_steps, params, obs_moments=False, start=start)
        return metrics["episode_return"], metrics["episode_cost"]

    def _init(self, key) -> AttackState:
        k_key, k_mean, k_op, k_att = jax.random.split(key, 4)
        mean = flat_init(self.model, k_mean, self.obs_dim)[0]
        return AttackState(key=jax.random.key_data(k_key), operator=self.operator.init(k_op, mean),
                           attacker=self.attacker.init(k_att, jnp.zeros(self.attack_dim, mean.dtype)),
                           generation=jnp.zeros((), jnp.int32))

    def _step(self, state: AttackState):
        key = jax.random.wrap_key_data(state.key)
        key, k_op, k_att, k_perm, k_days, k_play, k_tell_op, k_tell_att = jax.random.split(key, 8)
        pop, n_ep = self.config.pop_size, self.config.episodes
        operators, op_es = self.operator.ask(k_op, state.operator)
        attacks, att_es = self.attacker.ask(k_att, state.attacker)
        perm = jax.random.permutation(k_perm, pop)
        days = jax.random.randint(k_days, (pop, n_ep), 0, self.env.num_days(self.env_params))

        def play(flat, genome, days_i, k):
            ret, cost = jax.vmap(lambda d, kk: self._day(flat, genome, self.env_params, d, kk))(days_i, jax.random.split(k, n_ep))
            return ret.mean(), cost.mean(0)

        ret, cost = jax.vmap(play)(operators, attacks[perm], days, jax.random.split(k_play, pop))
        damage = cost[:, self.damage_idx].sum(-1)
        op_fitness = ret - self.config.penalty * cost.sum(-1)
        att_fitness = jnp.zeros_like(damage).at[perm].set(damage)
        op_es = self.operator.tell(k_tell_op, operators, op_fitness, op_es)
        att_es = self.attacker.tell(k_tell_att, attacks, att_fitness, att_es)
        state = AttackState(key=jax.random.key_data(key), operator=op_es, attacker=att_es, generation=state.generation + 1)
        metrics = {"return": ret.mean(), "damage_mean": damage.mean(), "damage_max": damage.max(),
                   "cost_channels": cost.mean(0)}
        return state, metrics

    def chosen_policy(self, state: AttackState):
        """The operator's distribution centre (on the test days' own outages when traced)."""
        return self._policy(self.operator.center(state.operator))

    def _evaluate(self, state: AttackState):
        """Per test day: the operator's centre without outages, under random plans and under the evolved plan."""
        params = self.split_params("test")
        flat = self.operator.center(state.operator)
        evolved = self.attacker.center(state.attacker)
        days = jnp.arange(self.env.num_days(params), dtype=jnp.int32)
        key = jax.random.key(EVAL_SEED)
        randoms = jax.random.normal(jax.random.fold_in(key, 1), (self.config.random_attacks, self.attack_dim))

        def on_days(genome):
            ret, cost = jax.vmap(lambda d: self._day(flat, genome, params, d, key))(days)
            return ret, cost[:, self.damage_idx].sum(-1), cost

        ret0, dmg0, cost0 = on_days(None)
        ret_r, dmg_r, _ = jax.vmap(on_days)(randoms)
        ret_e, dmg_e, _ = on_days(evolved)
        return {"return_no_attack": ret0.mean(), "damage_no_attack": dmg0.mean(), "cost_channels": cost0.mean(0),
                "return_random_attack": ret_r.mean(), "damage_random_attack": dmg_r.mean(),
                "damage_random_attack_worst": dmg_r.max(0).mean(),
                "return_evolved_attack": ret_e.mean(), "damage_evolved_attack": dmg_e.mean(),
                "attack_lines": self.attack_plan(evolved)[1]}
