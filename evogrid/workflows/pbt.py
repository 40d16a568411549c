"""PBTWorkflow: population-based training (Jaderberg et al. 2017, "Population based training of neural
networks") of a gradient learner (`--algorithm pbt` trains PPO agents, `pbt_td3` TD3 agents).

`agents` members, each an `RLWorkflow` learner with its own networks, optimiser state, environments,
constraint multiplier and hyper-parameters, take one iteration each per compiled call (`jax.vmap` over
the members of `RLWorkflow.train`: the explored hyper-parameters are traced values, so one program
serves every setting). Every `select_every` iterations each member's deterministic policy is played on
the validation days, and

* the run's chosen policy is updated from the members' scores as every workflow chooses (`Chosen`:
  feasibility first, then the return);
* exploit: the members ranked in the last `truncation` share (by the same feasibility-first order)
  take a copy of the learner state (networks, optimiser states, for TD3 the replay buffer) and the
  multiplier of a member drawn from the first `truncation` share;
* explore: the copy's hyper-parameters are the donor's, each multiplied by `perturb` or 1 / `perturb`
  (even odds) and clipped to its range in `RANGES`. Members keep their own environments and keys.

The explored hyper-parameters (`explore`) start at the config's values for member 0 and log-uniform over
their `RANGES` for the others, so the population holds the single learner's configuration at the start.
Equal env-step budget: a member plays `num_envs` environments (default 4, so the default 4 members play
as many env steps per iteration as one default PPO run's 16).
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.utils.config import param
from evogrid.utils.jax_utils import strong_types, tree_where
from evogrid.workflows.base import Chosen, better
from evogrid.workflows.rl import RLConfig, RLState, RLWorkflow, rl_config

RANGES = {   # explorable hyper-parameter -> (lo, hi): where members start (log-uniform) and are clipped to
    "learning_rate": (1e-4, 1e-2),
    "ent_coef": (1e-5, 1e-2),
    "clip_eps": (0.05, 0.4),
    "expl_noise": (0.02, 0.4),
    "lagrange_ki": (0.01, 1.0),
    "lagrange_kp": (0.1, 10.0),
}


EXPLORE_HELP = f"hyper-parameters the population explores (any of {', '.join(RANGES)} the learner has)"


@dataclasses.dataclass(frozen=True)
class PBTFields(RLConfig):
    """The population's own fields (added to the learner's config by `pbt_config`)."""

    agents: int = param(4, "members of the population", lo=2)
    num_envs: int = param(4, "parallel environments per member", lo=1, cli="--envs")
    select_every: int = param(10, "generations (iterations) between validation rounds (choice of the policy, exploit and explore)",
                              lo=1)
    truncation: float = param(0.25, "share of the population replaced at each round (and the share copied from)",
                              lo=0.0, lo_open=True, hi=0.5)
    perturb: float = param(1.25, "factor an explored hyper-parameter is multiplied or divided by", lo=1.0)
    explore: tuple[str, ...] = param(("learning_rate", "lagrange_ki"), EXPLORE_HELP)

    def _check(self):
        unknown = [h for h in self.explore if h not in RANGES or not hasattr(self, h)]
        if unknown:
            mine = [h for h in RANGES if hasattr(self, h)]
            raise ValueError(f"cannot explore {', '.join(unknown)} with {self.algorithm}; choose from {', '.join(mine)}")
        if len(set(self.explore)) < len(self.explore):
            raise ValueError(f"explore names a hyper-parameter twice: {', '.join(self.explore)}")


def pbt_config(agent, name: str, explore: tuple[str, ...]) -> type:
    """The config class of population-based training of `agent` registered as `name`, exploring `explore` by
    default."""
    base = rl_config(agent)
    fields = [("algorithm", str, param(name, f"population-based training of {agent.name}", choices=(name,))),
              ("explore", tuple[str, ...], param(explore, EXPLORE_HELP))]
    cls = dataclasses.make_dataclass(base.__name__.replace("Config", "PBTConfig"), fields,
                                     bases=(PBTFields, base), frozen=True)
    cls.__module__ = __name__
    cls.agent = agent
    return cls


@struct.dataclass
class PBTState:
    key: jnp.ndarray          # uint32 key data (exploit and explore draws)
    members: RLState          # every member's learner, stacked [agents, ...] (their own best_actor/chosen unused)
    hypers: dict              # explored name -> [agents] values
    leader: jnp.ndarray       # int32: the member ranked first at the latest round
    replaced: jnp.ndarray     # int32: members replaced so far
    iteration: jnp.ndarray
    best_actor: Any
    chosen: Chosen


def _with(config, values: dict):
    """A copy of a frozen config with some fields set to traced values (no validation: they are arrays)."""
    out = copy.copy(config)
    for name, value in values.items():
        object.__setattr__(out, name, value)
    return out


class PBTWorkflow(RLWorkflow):
    """Population-based training of a gradient learner; `config` comes from `pbt_config(agent, name)`."""

    def _member(self, hyper: dict):
        """The learner and workflow config of a member with explored values `hyper` (traced)."""
        cfg = _with(self.config, hyper)
        agent = type(self.agent)(_with(self.agent.config, hyper), self.obs_dim, self.act_dim, len(self.cost_names),
                                 self.config.hidden)
        return agent, cfg

    def _init(self, key) -> PBTState:
        cfg = self.config
        key, k_members, k_hyper = jax.random.split(key, 3)
        members = jax.jit(jax.vmap(super()._init))(jax.random.split(k_members, cfg.agents))
        hypers = {}
        for name, k in zip(cfg.explore, jax.random.split(k_hyper, len(cfg.explore))):
            lo, hi = RANGES[name]
            drawn = jnp.exp(jax.random.uniform(k, (cfg.agents,), minval=jnp.log(lo), maxval=jnp.log(hi)))
            hypers[name] = drawn.at[0].set(jnp.clip(getattr(cfg, name), lo, hi))
        first = jax.tree_util.tree_map(lambda x: x[0], members)
        state = PBTState(key=jax.random.key_data(key), members=members, hypers=hypers, leader=jnp.int32(0),
                         replaced=jnp.int32(0), iteration=jnp.zeros((), jnp.int32), best_actor=first.agent.actor,
                         chosen=self.new_chosen())
        return strong_types(state)

    def _step(self, state: PBTState):
        cfg = self.config

        def one(member, hyper):
            return self.train(member, *self._member(hyper))

        members, metrics = jax.vmap(one)(state.members, state.hypers)
        state = state.replace(members=members, iteration=state.iteration + 1)
        state = jax.lax.cond(state.iteration % cfg.select_every == 0, self._round, lambda s: s, state)
        leader = {f"hp_{name}": v[state.leader] for name, v in state.hypers.items()}
        scalars = {k: v.mean(0) for k, v in metrics.items() if k != "env_steps"}
        return state, {**scalars, "env_steps": metrics["env_steps"].sum(), **state.chosen.metrics(), **leader,
                       "replaced": state.replaced.astype(jnp.float32)}

    def _round(self, state: PBTState) -> PBTState:
        """A validation round: every member's policy on the validation days, the chosen policy updated, the
        last `truncation` share replaced by perturbed copies of the first."""
        cfg, n = self.config, self.config.agents
        members = state.members
        ret, day_cost = jax.vmap(lambda m: self.validation_score(self._policy(m.agent, m.agent.actor)))(members)
        weights = jax.vmap(lambda lag: lag.weights())(members.lagrangian).mean(0)
        k, chosen = state.chosen.consider(ret, day_cost, weights)
        actors = members.agent.actor
        best_actor = tree_where(k >= 0, jax.tree_util.tree_map(lambda x: x[jnp.maximum(k, 0)], actors), state.best_actor)

        # rank: how many members each one beats, feasibility first (ties keep the lower index first)
        scores = chosen.scores(ret, day_cost, weights)
        mine = tuple(x[:, None] for x in scores)
        theirs = tuple(x[None, :] for x in scores)
        wins = jnp.sum(better(mine, theirs), axis=1)
        order = jnp.argsort(-wins, stable=True)
        m = max(1, int(cfg.truncation * n))
        key = jax.random.wrap_key_data(state.key)
        key, k_donor, k_factor = jax.random.split(key, 3)
        donors = order[jax.random.randint(k_donor, (m,), 0, m)]
        source = jnp.arange(n).at[order[n - m:]].set(donors)
        copied = source != jnp.arange(n)

        take = lambda x: x[source]  # noqa: E731
        members = members.replace(agent=jax.tree_util.tree_map(take, members.agent),
                                  lagrangian=jax.tree_util.tree_map(take, members.lagrangian))
        hypers = {}
        for name, k_h in zip(cfg.explore, jax.random.split(k_factor, len(cfg.explore))):
            lo, hi = RANGES[name]
            factor = jnp.where(jax.random.bernoulli(k_h, 0.5, (n,)), cfg.perturb, 1.0 / cfg.perturb)
            value = state.hypers[name][source]
            hypers[name] = jnp.where(copied, jnp.clip(value * factor, lo, hi), value).astype(value.dtype)
        return state.replace(key=jax.random.key_data(key), members=members, hypers=hypers, leader=order[0].astype(jnp.int32),
                             replaced=state.replaced + m, best_actor=best_actor, chosen=chosen)

    def chosen_policy(self, state: PBTState):
        leader = jax.tree_util.tree_map(lambda x: x[state.leader], state.members.agent)
        actor = tree_where(jnp.isfinite(state.chosen.ret), state.best_actor, leader.actor)
        return self._policy(leader, actor)
