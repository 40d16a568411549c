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

from evogrid.baselines.report import Reference, register_reference
from evogrid.rollout import play_days


def competitive_days(env, params):
    """Per day of `params`, played with zero mark-ups: (summed profit in reward units, load-weighted mean
    price $/MWh, consumer payment $) as arrays [n_days]."""
    n_act = env.action_space(params).shape[0]
    m = jax.jit(lambda: play_days(env, params, lambda obs: -jnp.ones(n_act, obs.dtype), info_sums=("consumer_payment",)))()
    profit, payment = (np.asarray(m[k], np.float64) for k in ("episode_return", "consumer_payment"))
    energy = np.asarray(params.load, np.float64).sum((1, 2)) * params.delta_t_hours   # MWh per day
    return profit, payment / energy, payment


def _reference_report(env, params, task, progress) -> dict:
    profit, price, payment = competitive_days(env, params)
    return {"days": int(len(profit)), "oracle_kind": "competitive", "oracle": None, "myopic": None,
            "competitive": {"return": profit.tolist(), "price": price.tolist(), "consumer_payment": payment.tolist()},
            "summary": {"competitive_return": float(profit.mean()), "competitive_price": float(price.mean()),
                        "consumer_payment": float(payment.mean())}}


register_reference("gencos", Reference(
    _reference_report, lambda task: "reference: every company offers at cost",
    lambda s: [("competitive mean price", f"{s['competitive_price']:.4f} $/MWh (load-weighted)"),
               ("companies' summed profit", f"{s['competitive_return']:.4f}"),
               ("consumer payment", f"{s['consumer_payment']:.1f} $ per day")], gap=False))
