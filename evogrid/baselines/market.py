"""Generation-company market: the competitive reference, every company offering at cost (zero mark-up).

The market operator clears each step by DC-OPF on the offers; with every offer at true cost the
clearing is the least-cost dispatch and its nodal prices the competitive prices. A learned or
co-evolved bidding strategy is judged against it by the price mark-up (the load-weighted mean price
over the competitive one, in %) and by the profit it moves from consumers to companies.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.rollout import collect


def competitive_days(env, params):
    """Per day of `params`, played with zero mark-ups: (summed profit in reward units, load-weighted mean
    price $/MWh, consumer payment $) as arrays [n_days]."""
    n_act = env.action_space(params).shape[0]

    @jax.jit
    def play(day):
        obs, state = env.reset_to_day(day, params)
        _, _, traj, _ = collect(env, params, lambda k, o: (-jnp.ones(n_act), None), jax.random.key(0), state, obs,
                                params.max_steps, reset=False)
        return traj.reward.sum(), traj.info["consumer_payment"].sum()

    days = jnp.arange(env.num_days(params), dtype=jnp.int32)
    profit, payment = jax.vmap(play)(days)
    energy = np.asarray(params.load, np.float64).sum((1, 2)) * params.delta_t_hours   # MWh per day
    return np.asarray(profit, np.float64), np.asarray(payment, np.float64) / energy, np.asarray(payment, np.float64)
