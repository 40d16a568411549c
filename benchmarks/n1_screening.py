"""N-1 screening throughput: post-contingency branch flows per second on case118, and env steps/s of the -n1 tasks.

    python benchmarks/n1_screening.py            # batch of 256 states (the issue's setting)
    python benchmarks/n1_screening.py --quick    # batch of 32, fewer reference solves

A "flow" is one branch's flow after one single outage: a state of case118 screens its 177 non-bridge
outages x 186 branches = 32,922 flows. The states are the case's own dispatch with loads scaled by
0.85-1.10 and seeded noise. Rows (all in this process, on the same states):
  evogrid n1_flows       jit(vmap) over the batch, the LODF product (float32)
  evogrid contingency    jit(vmap) of `contingency_flows` with one line already out (the env's path)
  numpy LODF             the same product in NumPy, float64, one state at a time
  PYPOWER loop           rundcpf with the branch removed, one call per outage, in Python
  pandapower loop        rundcpp with the line out of service, one call per outage, in Python
The two reference loops are timed on a few states/outages and reported per flow (their cost does not
depend on the batch). Ratios are against the pandapower loop measured here.
"""
from __future__ import annotations

import argparse
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from evogrid import physics as ph
from evogrid.case import load_case
from evogrid.case.matpower import PD, PF, PG


def _best(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _states(case, n, seed=0):
    rng = np.random.default_rng(seed)
    level = rng.uniform(0.85, 1.10, (n, 1)) * rng.normal(1.0, 0.02, (n, case.n_bus))
    inj = np.zeros((n, case.n_bus))
    np.add.at(inj.T, case.gen_bus, (case.gen[:, PG] * level[:, :1]).T)
    return inj - case.bus[:, PD] * level


def _pypower_rate(case, n_states, outages):
    """Per-flow rate of rundcpf with the branch removed (the case's own dispatch: a solve costs the same
    whatever the injections)."""
    from pypower.api import ppoption, rundcpf

    opts = ppoption(VERBOSE=0, OUT_ALL=0)
    ppc = {"version": "2", "baseMVA": case.base_mva, "bus": case.bus.copy(), "gen": case.gen.copy(), "branch": case.branch.copy()}
    t0 = time.perf_counter()
    for _ in range(n_states):
        for k in outages:
            rundcpf({**ppc, "branch": np.delete(ppc["branch"], k, axis=0)}, opts)[0]["branch"][:, PF]
    return n_states * len(outages) * case.n_branch / (time.perf_counter() - t0)


def _pandapower_rate(case, outages):
    import pandapower as pp
    import pandapower.networks as pn

    logging.getLogger("pandapower").setLevel(logging.ERROR)
    net = pn.case118()
    lines = net.line.index[: len(outages)]
    t0 = time.perf_counter()
    for k in lines:
        net.line.loc[k, "in_service"] = False
        pp.rundcpp(net)
        net.line.loc[k, "in_service"] = True
    n_branch = len(net.line) + len(net.trafo)
    return len(lines) * n_branch / (time.perf_counter() - t0)


def _env_rate(task, n, steps=48, repeats=3):
    from evogrid.envs import make
    from evogrid.utils.jax_utils import batch_reset, scan_rollout, split_key_for_envs

    env, params = make(task)
    n_act = env.action_space(params).shape[0]

    @jax.jit
    def run(key):
        _, states = batch_reset(env, split_key_for_envs(key, n), params)
        acts = jax.random.uniform(key, (n, steps, n_act), minval=-1.0, maxval=1.0)
        # rewards and costs: returning rewards alone would let XLA drop the screening
        return jax.vmap(lambda s, k, a: scan_rollout(env, k, s, params, a)[2:4])(states, split_key_for_envs(key, n), acts)

    run(jax.random.key(0))
    return n * steps / _best(lambda: run(jax.random.key(1)), repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    batch, repeats = (32, 3) if args.quick else (256, 5)
    case = load_case("118")
    model = ph.make_outage_model(case)
    net = ph.make_dc_network(case)
    contingencies = jnp.flatnonzero(~model.bridge)
    inj = _states(case, batch)
    flows = jax.vmap(lambda p: ph.dc_line_flows(net, p)[0])(jnp.asarray(inj, jnp.float32))
    per_state = contingencies.shape[0] * case.n_branch

    screen = jax.jit(jax.vmap(lambda f: ph.n1_flows(model, f, contingencies)))
    jax.block_until_ready(screen(flows))
    rows = [("evogrid n1_flows (jit, vmap)", batch * per_state / _best(lambda: screen(flows), repeats))]
    out = jnp.full((batch, 1), int(contingencies[5]), jnp.int32)
    now = jax.vmap(lambda f, o: ph.outage_flows(model, f, o)[0])(flows, out)
    screen_out = jax.jit(jax.vmap(lambda f, o: ph.contingency_flows(model, f, o, contingencies)[0]))
    jax.block_until_ready(screen_out(now, out))
    rows.append(("evogrid contingency_flows, 1 line out", batch * per_state / _best(lambda: screen_out(now, out), repeats)))

    with jax.enable_x64(True):
        model64 = ph.make_outage_model(case)
    lodf = np.asarray(model64.lodf)[:, np.asarray(contingencies)]
    c = np.asarray(contingencies)
    f64 = np.asarray(flows, np.float64)
    t0 = time.perf_counter()
    for f in f64:
        f[None, :] + lodf.T * f[c][:, None]
    rows.append(("numpy LODF, one state at a time", batch * per_state / (time.perf_counter() - t0)))
    n_ref = 2 if args.quick else 4
    rows.append(("PYPOWER rundcpf loop", _pypower_rate(case, 1, c[: 10 * n_ref])))
    rows.append(("pandapower rundcpp loop", _pandapower_rate(case, c[: 5 * n_ref])))
    reference = rows[-1][1]
    print(f"case118, {batch} states, {contingencies.shape[0]} non-bridge outages x {case.n_branch} branches, "
          f"{jax.devices()[0].platform}")
    print(f"| {'method':<40} | {'post-contingency flows/s':>24} | {'x pandapower':>12} |")
    print(f"|{'-' * 42}|{'-' * 26}|{'-' * 14}|")
    for name, rate in rows:
        print(f"| {name:<40} | {rate:>24,.0f} | {rate / reference:>12,.0f} |")

    print(f"\nenv steps/s, {batch} envs x 48 steps, random actions (jit(vmap(scan_rollout)))")
    print(f"| {'task':<16} | {'steps/s':>10} | {'x plain task':>12} |")
    print(f"|{'-' * 18}|{'-' * 12}|{'-' * 14}|")
    for name in ("14", "118"):
        plain = _env_rate(f"tso-case{name}", batch, repeats=repeats)
        secure = _env_rate(f"tso-case{name}-n1", batch, repeats=repeats)
        print(f"| {'tso-case' + name:<16} | {plain:>10,.0f} | {1.0:>12.2f} |")
        print(f"| {'tso-case' + name + '-n1':<16} | {secure:>10,.0f} | {secure / plain:>12.2f} |")


if __name__ == "__main__":
    main()
