"""Decision time per interval: a learned policy (MLP forward, with and without the safety layer) against the
operator's MPC (one rolling solve), in one process on the same machine.

    python benchmarks/decision_time.py                 # tso-case5, tso-case14, tso-case118, dso-case33bw
    python benchmarks/decision_time.py --tasks tso-case14 --days 2   # quicker: fewer test days for the MPC

The reason to learn a policy at all is that it decides in a fraction of the MPC's time. Rows per task:
  policy           the workflows' MLP (32x32, tanh) on one observation, compiled: median of 200 calls
  policy + layer   the same, then the task's safety layer's correction (`bench.decision_seconds`)
  MPC              the rolling DC-OPF on the observation's forecast (transmission) or the interval's
                   LinDistFlow QP with its power-flow corrections (dso): mean seconds per decision over
                   `--days` test days played through the env with the layer
Ratios are the MPC's time over each row's. The MLP's weights are random: its forward pass costs the same
whatever they are; the layer's cost can depend on how far the action is from a feasible one.
"""
from __future__ import annotations

import argparse
import logging

import jax

from evogrid.baselines.operators import rolling_mpc
from evogrid.bench import decision_seconds
from evogrid.envs import make
from evogrid.networks import flat_init, make_vmap_mlp
from evogrid.safety import shield

TASKS = ("tso-case5", "tso-case14", "tso-case118", "dso-case33bw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--days", type=int, default=16, help="test days the MPC plays (default all 16; some days need more solves)")
    args = parser.parse_args()
    logging.getLogger("jax").setLevel(logging.ERROR)
    print(f"decision time per interval, {jax.devices()[0].platform.upper()}, MPC over {args.days} test day(s)\n")
    print("| task | row | ms / decision | MPC / row |")
    print("|---|---|---|---|")
    for task in args.tasks.split(","):
        env, params = make(task, split="test")
        safe = shield(env, params)
        obs_dim, act_dim = env.observation_space(params).shape[0], env.action_space(params).shape[0]
        model, _, _ = make_vmap_mlp(obs_dim, act_dim)
        flat, unravel = flat_init(model, jax.random.key(0), obs_dim)
        weights = unravel(flat)

        def policy(obs):
            return model.apply(weights, obs)

        obs = env.reset_to_day(0, params)[0]
        mpc = rolling_mpc(safe, params, range(args.days))[3]
        rows = [("policy", decision_seconds(env, policy, obs)), ("policy + layer", decision_seconds(safe, policy, obs)),
                ("MPC", mpc)]
        for name, seconds in rows:
            print(f"| {task} | {name} | {1e3 * seconds:.3f} | {mpc / seconds:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
