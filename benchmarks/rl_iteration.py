"""Seconds per training iteration of PPO, TD3, SAC, ERL and CEM-RL on one task, in one run.

    python benchmarks/rl_iteration.py                  # tso-case14, settings below
    python benchmarks/rl_iteration.py --task tso-case5 --repeats 3

Settings follow EvoRL's defaults in spirit, scaled to a 2-core CPU: PPO 64 envs x 48 steps, 4
epochs x 4 minibatches; TD3 and SAC 16 envs x 48 steps and 192 updates of batch 256; ERL and CEM-RL a
population of 10 (+ the learner) playing one 48-step episode each and 192 critic updates per
generation (CEM-RL: 48 critic-guided actor steps for half of the population). One iteration
is one compiled call; the best of `repeats` calls after the first (compile) is reported.
"""
from __future__ import annotations

import argparse

import jax
from _timing import time_steps

from evogrid.workflows import (
    ERLConfig,
    ERLWorkflow,
    PPOConfig,
    RLWorkflow,
    SACConfig,
    TD3Config,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="tso-case14")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    horizon = 48
    rows = [
        ("PPO", RLWorkflow(PPOConfig(task=args.task, num_envs=64, rollout_len=horizon)), 64 * horizon,
         "64 envs x 48 steps, 4 epochs x 4 minibatches"),
        ("TD3", RLWorkflow(TD3Config(task=args.task, num_envs=16, rollout_len=horizon, updates_per_iter=192,
                                     warmup_steps=0)), 16 * horizon, "16 envs x 48 steps, 192 updates x 256"),
        ("SAC", RLWorkflow(SACConfig(task=args.task, num_envs=16, rollout_len=horizon, updates_per_iter=192,
                                     warmup_steps=0)), 16 * horizon, "16 envs x 48 steps, 192 updates x 256"),
        ("ERL", ERLWorkflow(ERLConfig(task=args.task, algorithm="erl", pop_size=10, updates_per_iter=192, warmup_steps=0)),
         11 * horizon, "GA 10 + TD3, 192 updates x 256"),
        ("CEM-RL", ERLWorkflow(ERLConfig(task=args.task, algorithm="cemrl", pop_size=10, updates_per_iter=192,
                                         warmup_steps=0)), 11 * horizon, "CEM 10 (5 critic-trained x 48 steps), 192 updates x 256"),
    ]
    print(f"# {args.task}, float32, {jax.devices()[0].platform.upper()}; best of {args.repeats} iterations after the compile")
    print("| algorithm | settings | env steps / iteration | s / iteration | env-steps/s | compile s |")
    print("|---|---|---|---|---|---|")
    for name, wf, steps, settings in rows:
        s, c = time_steps(wf, args.repeats)
        print(f"| {name} | {settings} | {steps} | {s:.4f} | {steps / s:,.0f} | {c:.1f} |", flush=True)


if __name__ == "__main__":
    main()
