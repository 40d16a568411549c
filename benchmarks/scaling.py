"""Seconds per ECWorkflow generation for populations of 256, 1024 and 4096 on one device, on two
devices of one process, and on two processes (jax.distributed over 127.0.0.1, one device each).

    python benchmarks/scaling.py              # tso-case14, Open_ES, 1 episode per individual
    python benchmarks/scaling.py --quick      # populations 256 and 1024, fewer repeats

Each configuration runs in fresh worker processes, since the device count is fixed when JAX
starts (`XLA_FLAGS=--xla_force_host_platform_device_count=2` for the two-device row). On a CPU
machine the forced devices share the same cores, so this measures the cost of the sharded
program (collectives, per-device dispatch), not a speed-up; on GPUs each device adds compute.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    if args.distributed:
        from evogrid.utils.sharding import initialize_distributed

        initialize_distributed()
    import jax

    from evogrid.workflows import ECConfig, ECWorkflow

    for pop in args.pops:
        wf = ECWorkflow(ECConfig(task=args.task, pop_size=pop, episodes_per_individual=1, obs_norm=False))
        state = wf.init()
        t0 = time.perf_counter()
        state, _ = wf.step(state)
        jax.block_until_ready(state)
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            state, _ = wf.step(state)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t0)
        if jax.process_index() == 0:
            print(json.dumps({"pop": pop, "s_per_gen": min(times), "compile_s": compile_s,
                              "devices": jax.device_count(), "processes": jax.process_count()}), flush=True)


def run(pops, repeats, task, devices=1, processes=1) -> dict:
    base = [sys.executable, __file__, "--worker", "--task", task, "--repeats", str(repeats), "--pops", *map(str, pops)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    if processes == 1:
        procs = [subprocess.Popen(base, env=env, stdout=subprocess.PIPE, text=True)]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen(base + ["--distributed"], stdout=subprocess.PIPE, text=True,
                                  env=dict(env, EVOGRID_COORDINATOR=f"127.0.0.1:{port}", EVOGRID_NUM_PROCESSES=str(processes),
                                           EVOGRID_PROCESS_ID=str(i))) for i in range(processes)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"worker failed (devices={devices}, processes={processes})")
    rows = [json.loads(line) for line in outs[0].splitlines() if line.startswith("{")]
    return {r["pop"]: r for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--task", default="tso-case14")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--distributed", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pops", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    pops, repeats = ([256, 1024], 3) if args.quick else (args.pops, args.repeats)
    one = run(pops, repeats, args.task)
    two = run(pops, repeats, args.task, devices=2)
    multi = run(pops, repeats, args.task, processes=2)
    print(f"# {args.task}, Open_ES, MLP 32x32, 1 episode x 48 steps per individual; best of {repeats} generations "
          "after the compile; CPU (forced host devices share the same cores)")
    print("| population | 1 device s/gen | 2 devices s/gen | 2 processes s/gen | 2 devices / 1 | 2 processes / 1 | env-steps/s (1 device) |")
    print("|---|---|---|---|---|---|---|")
    for pop in pops:
        a, b, c = one[pop]["s_per_gen"], two[pop]["s_per_gen"], multi[pop]["s_per_gen"]
        print(f"| {pop} | {a:.4f} | {b:.4f} | {c:.4f} | {b / a:.2f}x | {c / a:.2f}x | {pop * 48 / a:,.0f} |")


if __name__ == "__main__":
    main()
