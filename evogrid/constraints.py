"""Constraint handling: one mechanism, the `Lagrangian`, used by every workflow and by `SafeRLWrapper`.

Environments report constraint violations as cost channels, never inside the reward. A
learner maximises the penalised objective

    return - sum_c w_c * cost_c            (per step: reward - w . costs; per episode: summed)

with one weight w_c per channel. `constraint` (a config field of every workflow) chooses w:

* "lagrangian" (default): w is adapted so that the mean episode cost of each channel is driven
  to its budget (default 0: feasible). The multiplier is a PID controller on the violation
  v_c = mean episode cost_c - budget_c (Stooke, Achiam & Abbeel 2020, "Responsive safety in RL
  by PID Lagrangian methods"):
      I_c <- max(0, I_c + v_c),   lambda_c = max(0, kp * v_c + ki * I_c)
  Scaling: cost channels come in their own units (p.u. of the case's base MVA for grid limits,
  MWh for SOC, ...) and returns in the task's (k$ per day, ...). So that one set of gains works
  on every task, lambda is dimensionless and the weight is w_c = lambda_c * S, where S is a
  running mean of |episode return|: lambda_c = 1 makes one unit of summed violation per
  episode cost as much as a whole episode's return. With a budget of 0 the multiplier only
  grows while there is violation and then stays, so rank-based evolution strategies end up
  ranking every feasible policy above every infeasible one (feasibility first) without a
  per-task penalty.
* "penalty": a fixed weight w_c = `penalty` (in return units per unit of cost), not adapted.
* "none": w = 0 (costs are reported, not optimised).
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import struct

from evogrid.utils.config import Config, param

MODES = ("lagrangian", "penalty", "none")


@dataclasses.dataclass(frozen=True)
class ConstraintConfig(Config):
    """Constraint fields shared by every workflow config, and the days the reported policy is chosen on
    (`select_on`: the choice weighs feasibility first, see workflows.base.Chosen)."""

    constraint: str = param("lagrangian", "constraint handling: lagrangian (adaptive multiplier towards the budget), "
                            "penalty (fixed weight) or none (costs reported, not optimised)", choices=MODES)
    cost_budget: float = param(0.0, "allowed summed cost per episode, each channel (lagrangian)", lo=0.0)
    penalty: float = param(1.0, "fixed weight per unit of cost, in return units (constraint=penalty)", lo=0.0)
    lagrange_ki: float = param(0.1, "integral gain of the multiplier (dimensionless per unit of violation)", lo=0.0)
    lagrange_kp: float = param(1.0, "proportional gain of the multiplier", lo=0.0)
    select_on: str = param("val", "days the reported policy is chosen on: val, or train+val (48 days instead of 8 "
                           "on synthetic tasks: feasible on more unseen days, at some cost; docs/evaluation.md)",
                           choices=("val", "train+val"))
    safety: str = param("auto", "safety layer between the policy and the grid (evogrid.safety: the security "
                        "redispatch on DC transmission tasks, the voltage correction on dso): auto (where the task "
                        "has one), on, or off (the raw policy)", choices=("auto", "on", "off"))
    reach_margin: float = param(0.0, "the security redispatch's look-ahead keeps each forecast demand within the "
                                "ramps' reach widened by this share of it (for the forecast's error; DC transmission "
                                "tasks; 0.01 kept tso-case2000goc's end-of-day drops in reach)", lo=0.0, hi=0.5)
    line_margin: float = param(0.0, "the security redispatch holds each line within its rating cut by this share "
                               "(room for what later intervals' redispatch cannot undo within the ramps; DC "
                               "transmission tasks)", lo=0.0, hi=0.5)


@struct.dataclass
class Lagrangian:
    """Per-channel multiplier state (arrays of shape [C]; `scale` a scalar)."""

    multiplier: jnp.ndarray    # lambda_c >= 0, dimensionless (episode returns per unit of cost)
    integral: jnp.ndarray      # I_c >= 0, accumulated violation
    scale: jnp.ndarray         # S: running mean |episode return| (0 before the first update)
    fixed: jnp.ndarray         # the fixed weight of constraint="penalty", or 0

    @classmethod
    def create(cls, n_channels: int, config: ConstraintConfig, dtype=None) -> Lagrangian:
        zeros = jnp.zeros((n_channels,), dtype or jnp.zeros(()).dtype)
        fixed = config.penalty if config.constraint == "penalty" else 0.0
        return cls(zeros, zeros, jnp.zeros((), zeros.dtype), jnp.asarray(fixed, zeros.dtype))

    def weights(self) -> jnp.ndarray:
        """w [C] in return units per unit of cost."""
        return self.multiplier * self.scale + self.fixed

    def penalise(self, value, costs):
        """(value - costs . w) / (1 + sum lambda): a reward [...] with step costs [..., C], or a return with
        episode costs. The division (Stooke et al.'s normalised form) keeps the learning signal's scale
        bounded as the multiplier grows, which off-policy critics need (docs/design/choices.md); it
        changes no ranking within a generation."""
        return (value - jnp.sum(costs * self.weights(), axis=-1)) / (1.0 + jnp.sum(self.multiplier))

    def update(self, episode_cost, episode_return, config: ConstraintConfig) -> Lagrangian:
        """One controller step from the mean episode cost [C] and mean episode return of the
        latest batch; a no-op unless constraint="lagrangian"."""
        if config.constraint != "lagrangian":
            return self
        violation = episode_cost - config.cost_budget
        integral = jnp.maximum(self.integral + violation, 0.0)
        multiplier = jnp.maximum(config.lagrange_kp * violation + config.lagrange_ki * integral, 0.0)
        size = jnp.abs(episode_return)
        scale = jnp.where(self.scale > 0, 0.9 * self.scale + 0.1 * size, size)
        return self.replace(multiplier=multiplier.astype(self.multiplier.dtype), integral=integral.astype(self.integral.dtype),
                            scale=scale.astype(self.scale.dtype))
