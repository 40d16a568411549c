"""The AC chord method's solve on the switched units' block (`physics.ac.chord_q_limits`), variants side by side in
one process on whatever device JAX sees: the bare env's env-steps/s under random actions (the rollout of
`accelerator.py`), against the library's own setting measured in the same run; the steps left without a
power-flow solution; and the returns' agreement with the host CPU.

    python benchmarks/ac_solver.py --tasks tso-case14-ac,tso-case118-ac --sizes 16384      # on the chip
    python benchmarks/ac_solver.py --smoke                                                   # small, any machine

Variants (`--variants`, comma-separated): gmres:K (K GMRES steps an iteration, `physics.ac._gmres_step`) and mr:K
(K minimal-residual steps, `_mr_step`, the solver before GMRES); `physics.ac.Q_SWEEPS` is K. The derivative's
iterations keep the minimal-residual steps either way.
Agreement: on an accelerator, the device against the host CPU with the same keys (`accelerator.differences`); on a
CPU, the exact products against the products rounded as a TPU's one bfloat16 pass rounds them (both operands to
bfloat16, the CPU's stand-in for the chip: how GMRES's breakdown on that rounding was found).
"""
from __future__ import annotations

import argparse
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
from accelerator import build_rollout, device_line, differences, env_rate, on_host, task_env

from evogrid.physics import ac

SOLVES = {"gmres": ac._gmres_step, "mr": ac._mr_step}


def parse_variant(text: str) -> tuple[str, int]:
    kind, _, steps = text.partition(":")
    if kind not in SOLVES or not steps.isdigit() or int(steps) < 1:
        raise SystemExit(f"ac_solver: variant {text!r}: write gmres:K or mr:K with K >= 1 steps an iteration")
    return kind, int(steps)


@contextlib.contextmanager
def solving(kind: str, steps: int):
    """`physics.ac` with the switched block solved by `kind` in `steps` steps an iteration (traced afresh inside)."""
    saved = ac._gmres_step, ac.Q_SWEEPS
    ac._gmres_step, ac.Q_SWEEPS = SOLVES[kind], steps
    try:
        yield
    finally:
        ac._gmres_step, ac.Q_SWEEPS = saved


def _chip_rounded(matrix, x):
    """`ac._correction` as a TPU runs it at DEFAULT precision: both operands rounded to bfloat16."""
    r = lambda a: a.astype(jnp.bfloat16).astype(a.dtype)  # noqa: E731
    return jnp.matmul(r(matrix), r(x), precision=jax.lax.Precision.HIGHEST)


def checks(task: str, n_envs: int, stand_in: bool) -> tuple[int, int, float, int, int]:
    """(steps without a power-flow solution, steps) of the rollout of `n_envs` envs on the default device, and
    `accelerator.differences` of its returns against the host CPU's; with `stand_in` (on a CPU) the rollout with
    the chip-rounded products against it instead."""
    env, params = task_env(task, False)
    run, key = build_rollout(env, params, n_envs), jax.random.key(1)
    here = jax.device_get(run(key, params))
    if not stand_in:
        rel, flips, sums, _ = differences(here, on_host(run, key, params))
    else:
        saved = ac._correction
        ac._correction = _chip_rounded
        try:   # a new jit: the cache of `run` would serve the exact products' trace
            rounded = jax.device_get(build_rollout(env, params, n_envs)(key, params))
        finally:
            ac._correction = saved
        rel, flips, sums, _ = differences(rounded, here)
    diverged = here[2][..., list(env.constraint_names(params)).index("ac_diverged")]
    return int(np.sum(diverged > 0.5)), int(diverged.size), rel, flips, sums


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small sizes (any machine)")
    ap.add_argument("--tasks", default="tso-case14-ac,tso-case118-ac")
    ap.add_argument("--variants", default="gmres:8,mr:8", help="besides the library's own (default gmres:8,mr:8)")
    ap.add_argument("--sizes", default=None, help="env batch sizes (default 16384; smoke 16)")
    ap.add_argument("--agree-envs", type=int, default=None, help="envs of the agreement rollout (default 64; smoke 4)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    own = ("gmres", ac.Q_SWEEPS)
    variants = [own] + [v for v in map(parse_variant, args.variants.split(",")) if v != own]
    sizes = [int(x) for x in (args.sizes or ("16" if args.smoke else "16384")).split(",")]
    n_agree = args.agree_envs or (4 if args.smoke else 64)
    on_cpu = jax.devices()[0].platform == "cpu"
    against = "exact vs chip-rounded products (CPU stand-in)" if on_cpu else "device vs host CPU"
    print(f"# {device_line()}; the library's solve: gmres:{ac.Q_SWEEPS}")
    print(f"\n| task | solve | N envs | env-steps/s | vs the library's | compile s | unsolved ({n_agree} envs x 48) "
          f"| returns, {against}: max relative difference | cost sums flipped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        for n in sizes:
            base = None
            for kind, steps in variants:
                with solving(kind, steps):
                    rate, compile_s = env_rate(task, False, n, args.repeats)
                    miss, total, rel, flips, sums = checks(task, n_agree, on_cpu)
                base = base or rate
                print(f"| {task} | {kind}:{steps} | {n:,} | {rate:,.0f} | {rate / base:.2f} | {compile_s:.1f} | "
                      f"{miss} / {total} | {rel:.1e} | {flips} / {sums} |", flush=True)


if __name__ == "__main__":
    main()
