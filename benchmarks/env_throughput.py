"""Env-steps/s of the grid task envs (TSO, DSO, DERs) under jit(vmap(scan_rollout)), against pandapower stepped in Python.

    python benchmarks/env_throughput.py            # N=256 envs, T=48 steps (the issue's setting)
    python benchmarks/env_throughput.py --quick    # N=64, fewer repeats
    python benchmarks/env_throughput.py --tasks tso-case5,dcmg   # those rows only (and their "+ layer" rows)

The evogrid rows use the PowerZooJax "complete pattern" exactly (batch_reset, uniform
actions [N, T, A], vmap(scan_rollout), returning the reward trajectory; XLA drops what
is not returned), plus a "full" column that also returns obs, costs and dones. The rows are the envs
as made (the physics step alone, as the peer and the reference compute it); the "+ layer" rows put the
task's safety layer (`evogrid.safety.shield`: the security redispatch, the voltage schedule on tso-case14-ac,
the voltage correction) between
the random actions and the env, what a policy run with the layer pays per step. The
reference loop re-dispatches pandapower's own network of the same MATPOWER case (random
set-points within limits, scaled loads) and solves it (rundcpp / runpp) once per step in Python;
for the feeders (33bw, 141) it is the same AC power flow the env solves each step, without the
resources' bookkeeping. Feeder rows use N/2 envs (the issue's N=128); the tso-case118-ac rows N/8 and at
most 2 timed calls (at full N they would take hours on 2 cores).
"""
from __future__ import annotations

import argparse
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.envs import make
from evogrid.safety import shield
from evogrid.utils.jax_utils import batch_reset, scan_rollout, split_key_for_envs

LAYER = " + layer"  # rows whose random actions pass through the task's safety layer
P_ONLY = " (P only, chord)"  # AC rows as the AC tasks were before voltage actions and reactive limits

# A peer JAX suite on a 2-core machine like ours (figures quoted in the issue, float32).
PEER = {("5", "DC"): 5.0e6, ("14", "DC"): 2.0e6, ("118", "DC"): 0.29e6, ("14", "AC"): 30e3, ("118", "AC"): 65.0}


def _time(fn, key, repeats):
    """Best (minimum) wall time over `repeats` calls: the least disturbed run on a shared 2-core VM."""
    times = []
    for i in range(repeats):
        k = jax.random.fold_in(key, i)
        jax.block_until_ready(k)
        t0 = time.perf_counter()
        jax.block_until_ready(fn(k))
        times.append(time.perf_counter() - t0)
    return min(times)


def evogrid_rate(task: str, n_envs: int, horizon: int, repeats: int, layer: bool = False, p_only: bool = False):
    options = {"voltage_control": False, "enforce_q_limits": False} if p_only else {}
    env, params = make(task, max_steps=horizon, **options) if horizon else make(task, **options)
    if layer:
        env = shield(env, params)
    horizon = params.max_steps
    n_act = env.action_space(params).shape[0]

    def build(full: bool):
        @jax.jit
        def collect(key):
            k_reset, k_actions, k_roll = jax.random.split(key, 3)
            _, states0 = batch_reset(env, split_key_for_envs(k_reset, n_envs), params)
            actions = jax.random.uniform(k_actions, (n_envs, horizon, n_act), minval=-1.0, maxval=1.0)
            single = lambda s, k, a: scan_rollout(env, k, s, params, a)  # noqa: E731
            _, obs, reward, costs, done, info = jax.vmap(single)(states0, split_key_for_envs(k_roll, n_envs), actions)
            return (obs, reward, costs, done, info.get("converged", jnp.ones_like(reward))) if full else reward

        return collect

    key = jax.random.key(0)
    lean, full = build(False), build(True)
    t0 = time.perf_counter()
    jax.block_until_ready(lean(key))
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(full(key))
    steps = n_envs * horizon
    converged = float(jnp.mean(full(key)[-1]))
    return steps / _time(lean, key, repeats), steps / _time(full, key, repeats), compile_s, converged


def pandapower_rate(case_name: str, ac: bool, steps: int):
    """pandapower's own network of the same MATPOWER case, re-dispatched and solved once per step."""
    import pandapower as pp
    import pandapower.networks as pn

    logging.getLogger("pandapower").setLevel(logging.ERROR)
    if hasattr(pn, f"case{case_name}"):
        net = getattr(pn, f"case{case_name}")()
    else:  # case141: pandapower does not ship it; convert the same MATPOWER data with its converter
        from pandapower.converter.pypower import from_ppc

        from evogrid.case import load_case

        c = load_case(case_name)
        net = from_ppc(dict(version="2", baseMVA=c.base_mva, bus=c.bus, gen=c.gen, branch=c.branch),
                       f_hz=50, validate_conversion=False)
    rng = np.random.default_rng(0)
    p_load, q_load = net.load.p_mw.values.copy(), net.load.q_mvar.values.copy()
    has_gen = len(net.gen) > 0  # a feeder (33bw) has only the substation
    pmin = net.gen.min_p_mw.fillna(0).values if has_gen else None
    pmax = net.gen.max_p_mw.fillna(net.gen.p_mw).values if has_gen else None
    solve = pp.runpp if ac else pp.rundcpp
    solve(net)  # warm-up: pandapower's first call compiles its numba kernels
    t0 = time.perf_counter()
    for _ in range(steps):
        scale = rng.uniform(0.6, 1.0)
        net.load["p_mw"] = p_load * scale
        net.load["q_mvar"] = q_load * scale
        if has_gen:
            net.gen["p_mw"] = pmin + 0.5 * (rng.uniform(-1, 1, len(pmin)) + 1) * (pmax - pmin) * scale
        solve(net)
        _ = net.res_line.p_from_mw.values  # read the flows, as the env does
    return steps / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N=64 and fewer repeats (a smoke run)")
    ap.add_argument("--pp-steps", type=int, default=30, help="pandapower reference steps per row")
    ap.add_argument("--tasks", default=None, help="comma-separated rows to measure (default: every row)")
    args = ap.parse_args()
    n_envs, horizon, repeats = (64, 48, 3) if args.quick else (256, 48, 30)
    # (task, pandapower case, AC?, envs, peer figure or None)
    # the DC rows twice: the env alone, which is what the peer and pandapower compute (one power flow per
    # step), and with the security redispatch in front
    dc = [(f"tso-case{c}", c, False, n_envs, PEER[(c, "DC")]) for c in ("5", "14", "118")]
    # tso-case118-ac runs some 60 env-steps/s on 2 cores: its rows play N/8 envs, best of at most 2 calls
    ac = [("tso-case14-ac", "14", True, n_envs, PEER[("14", "AC")]), ("tso-case118-ac", "118", True, n_envs // 8, PEER[("118", "AC")])]
    rows = [r for row in dc for r in (row, (row[0] + LAYER,) + row[1:])] + [
            r for row in ac for r in ((row[0] + P_ONLY,) + row[1:], row)] + [("tso-case14-ac" + LAYER,) + ac[0][1:]] + [("dso-case33bw", "33bw", True, n_envs // 2, None),
            ("dso-case33bw" + LAYER, "33bw", True, n_envs // 2, None),
            ("ders-case141", "141", True, n_envs // 2, None), ("dcmg", None, False, n_envs // 4, None),
            ("gencos-case5", None, False, n_envs, None)]
    if args.tasks:
        wanted = [t.strip() for t in args.tasks.split(",") if t.strip()]
        base = lambda name: name.removesuffix(LAYER).removesuffix(P_ONLY)  # noqa: E731
        known = sorted({base(row[0]) for row in rows})
        if unknown := [t for t in wanted if t not in known]:
            ap.error(f"unknown rows {unknown}; the rows are {', '.join(known)}")
        rows = [row for row in rows if base(row[0]) in wanted]
    print(f"# evogrid figures: best of {repeats} calls after the first (compile) call; run-to-run spread on a")
    print("# 2-core VM is about +-20%. pandapower: its own caseN network, one solve per step in Python.")
    header = ("task", "N", "evogrid steps/s", "full-traj steps/s", "compile s", "converged",
              "pandapower steps/s", "x pandapower", "peer steps/s", "x peer")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    # DCMG runs its own day of 288 five-minute steps (T=288); DCMG and GenCos (a market clearing,
    # not a power flow) have no pandapower counterpart
    try:  # the reference is optional: without pandapower the evogrid columns are still measured and printed
        import pandapower  # noqa: F401
        have_pp = True
    except ImportError:
        have_pp = False
        print("# pandapower is not installed (`pip install -e .[test]`): its columns show n/a")
    measured = [(row, *evogrid_rate(row[0].removesuffix(LAYER).removesuffix(P_ONLY), row[3], 0 if row[0] == "dcmg" else horizon,
                                    min(repeats, 2) if row[0].startswith("tso-case118-ac") else repeats,
                                    row[0].endswith(LAYER), row[0].endswith(P_ONLY))) for row in rows]
    for (task, pp_case, ac, n, peer), lean, full, compile_s, conv in measured:  # pandapower after, so its threads do not overlap ours
        ref_cols = "- | -" if have_pp or not pp_case else "n/a | n/a"
        if pp_case and have_pp:
            ref = pandapower_rate(pp_case, ac, max(5, args.pp_steps // (3 if ac and pp_case == "118" else 1)))
            ref_cols = f"{ref:,.0f} | {lean / ref:,.0f}x"
        peer_cols = f"{peer:,.0f} | {lean / peer:.2f}x" if peer else "- | -"
        print(f"| {task} | {n} | {lean:,.0f} | {full:,.0f} | {compile_s:.1f} | {conv:.4f} | "
              f"{ref_cols} | {peer_cols} |", flush=True)


if __name__ == "__main__":
    main()
