"""evogrid and PowerZooJax side by side, in one run on whatever device JAX sees, with the peer's methodology: one
jit of a batched reset + uniform random actions [N, T, A] + vmap(scan) of `env.step` (auto-reset), every
output returned (obs, reward, costs, done and info, so XLA drops nothing).

    python benchmarks/vs_powerzoojax.py --peer PATH          # PATH: a checkout of PowerZooJax (MIT; not on PyPI)
    python benchmarks/vs_powerzoojax.py --peer PATH --envs 16384 --tasks tso-case14,tso-case118

PowerZooJax is imported from PATH at run time and never copied into evogrid. The pairs are the tasks both
suites have: transmission dispatch on IEEE 5/14/118 (DC), IEEE 14 in AC (evogrid's task with its reactive
limits off, which the peer's AC power flow does not have; its voltage set-point actions kept), the 33-bus
feeder and the data-centre microgrid. Each row is the best of `--rounds` timed calls per suite, the two
suites alternating, after one compile call each; the ratio is evogrid's env-steps/s over the peer's.
"""
from __future__ import annotations

import argparse
import sys
import time

import jax

PAIRS = {   # evogrid task (and make() options) -> the peer's env and params, built from its package
    "tso-case5": ({}, "trans", "5"),
    "tso-case14": ({}, "trans", "14"),
    "tso-case118": ({}, "trans", "118"),
    "tso-case14-ac": ({"enforce_q_limits": False}, "trans-ac", "14"),
    "dso-case33bw": ({}, "dist", "33bw"),
    "dcmg": ({}, "dcmg", None),
}


def peer_env(kind: str, case_id):
    from powerzoojax.case import load_case
    from powerzoojax.envs import (DataCenterMicrogridEnv, DistGridEnv, TransGridEnv, make_dcmicrogrid_params,
                                  make_dist_params, make_trans_params)

    if kind == "trans":
        return TransGridEnv(), make_trans_params(load_case(case_id))
    if kind == "trans-ac":
        return TransGridEnv(), make_trans_params(load_case(case_id), physics=1)
    if kind == "dist":
        return DistGridEnv(), make_dist_params(load_case(case_id))
    return DataCenterMicrogridEnv(), make_dcmicrogrid_params()


def rollout(env, params, n_envs: int):
    """The peer's pattern, jitted: (key) -> every output of N envs x T steps."""
    # the peer's microgrid keeps its horizon in its data-centre sub-params
    horizon = int(params.max_steps if hasattr(params, "max_steps") else params.dc.max_steps)
    shape = env.action_space(params).shape

    @jax.jit
    def run(key):
        k_reset, k_act, k_step = jax.random.split(key, 3)
        _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, n_envs), params)
        actions = jax.random.uniform(k_act, (n_envs, horizon, *shape), minval=-1.0, maxval=1.0)

        def one(state, key, acts):
            def body(s, x):
                k, a = x
                obs, s, reward, costs, done, info = env.step(k, s, a, params)
                return s, (obs, reward, costs, done, info)
            return jax.lax.scan(body, state, (jax.random.split(key, horizon), acts))[1]

        return jax.vmap(one)(states, jax.random.split(k_step, n_envs), actions)

    return run, n_envs * horizon


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="path of a PowerZooJax checkout (the folder holding powerzoojax/)")
    ap.add_argument("--envs", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(PAIRS))
    args = ap.parse_args(argv)
    unknown = [t for t in args.tasks.split(",") if t not in PAIRS]
    if unknown:
        ap.error(f"no peer task for {', '.join(unknown)}; pairs: {', '.join(PAIRS)}")
    sys.path.insert(0, args.peer)
    try:
        import powerzoojax  # noqa: F401
    except ImportError as err:
        ap.error(f"cannot import powerzoojax from {args.peer} ({err}); pass the folder that holds powerzoojax/")
    from evogrid.envs import make

    dev = jax.devices()[0]
    print(f"# {dev.platform.upper()} {dev.device_kind}; jax {jax.__version__}; {args.envs:,} envs, best of {args.rounds} "
          "calls each, alternating")
    print("| task | evogrid env-steps/s | PowerZooJax env-steps/s | evogrid / peer | compile s (evogrid, peer) |")
    print("|---|---|---|---|---|")
    for task in args.tasks.split(","):
        options, kind, case_id = PAIRS[task]
        ours, peer = make(task, **options), peer_env(kind, case_id)
        runs, compile_s = [], []
        for env, params in (ours, peer):
            run, steps = rollout(env, params, args.envs)
            t0 = time.perf_counter()
            jax.block_until_ready(run(jax.random.key(0)))
            compile_s.append(time.perf_counter() - t0)
            runs.append((run, steps))
        best = [float("inf"), float("inf")]
        for r in range(args.rounds):
            for i, (run, _) in enumerate(runs):
                key = jax.random.key(r + 1)
                t0 = time.perf_counter()
                jax.block_until_ready(run(key))
                best[i] = min(best[i], time.perf_counter() - t0)
        rate = [steps / b for (_, steps), b in zip(runs, best)]
        label = task + (" (reactive limits off)" if options.get("enforce_q_limits") is False else "")
        print(f"| {label} | {rate[0]:,.0f} | {rate[1]:,.0f} | {rate[0] / rate[1]:.2f} | {compile_s[0]:.1f}, "
              f"{compile_s[1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
