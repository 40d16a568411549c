"""One table for an accelerator (or any device JAX sees): every task's env-steps/s with and without its safety
layer, ECWorkflow seconds per generation, and the agreement of the chip's rollouts with the host CPU's.

    python benchmarks/accelerator.py                   # every part, the chip's sizes
    python benchmarks/accelerator.py --smoke           # small sizes: runs anywhere (CPU included), its own smoke test
    python benchmarks/accelerator.py --parts envs,agree --tasks tso-case14,tso-case118
    python benchmarks/accelerator.py --parts audit --tasks tso-case118   # the compiled program's matrix products

Parts:
  envs   env-steps/s (the PowerZooJax pattern: one jit of batch_reset + uniform actions [N, T, A] + vmap(scan),
         every output returned), the bare env and "+ layer" (the task's safety layer between the actions and
         the env), at each batch size N; best of `--repeats` calls after the compile.
  agree  the same rollout (same keys, N = `--agree-envs`) on the default device and on the host CPU: the largest
         relative difference of the episode returns, and how many (env, channel) cost sums are zero on one and
         not on the other ("flips"; a sum counts as zero below 1e-6 p.u.).
  ec     ECWorkflow (Open_ES, one 48-step episode per individual, MLP 32x32, obs normalisation off) seconds per
         generation at each population, layer on and off.
  train  `evogrid train`'s loop (`Workflow.learn`: the CLI's defaults, a run directory with metrics, validation
         rounds and checkpoints every `--checkpoint-every`) at each population: the first call (compile + run),
         then the wall time per generation after it and the share of it spent in the compiled calls (results
         pulled to the host included), and the process's peak host memory (with what was resident once the
         device was opened: a TPU runtime holds ~13 GiB of host memory from then on).
  fits   the largest batch each task's programs fit in the device's memory (`utils.memory`: the program compiled
         at `--probe` and twice that, its need extended along the line; nothing is allocated): the `evogrid train`
         population (its defaults: Open_ES, 4 episodes per member, the layer on) and the envs of the rollout
         above. EVOGRID_DEVICE_MEMORY stands in for a device that does not say (a CPU).
  audit  the optimised program the device compiles for a task's rollout: every matrix product (dot,
         convolution) with the precision the compiler gave it and the source line it came from; any that
         runs at the default (on a TPU: bfloat16 passes) is the physics losing digits.
  blocks the rollouts above and `make_random_rollout` (rewards, costs and infos kept) at one step an iteration of
         their loop and at `rollout.LOOP_BLOCK` (`scan_steps`: the accelerator's default), `--sizes`' first N.
  profile where a task's rollout spends its time (`--sizes`' first N, `--layers`): two calls traced with
         jax.profiler, the device's ops summed by name, the `--top` largest with their share of the ops' time
         and the source line and op name the compiled program gives each (a fusion: its root's).
Writes the table to stdout (and to `--out` when given).
"""
from __future__ import annotations

import argparse
import re
import sys
import time

import jax
import numpy as np
from _timing import time_steps

TASKS = ("tso-case5", "tso-case14", "tso-case118", "tso-case14-n1", "tso-case14-ac", "tso-case118-ac",
         "dso-case33bw", "ders-case141", "dcmg", "gencos-case5", "gencos-case14")
ZERO_COST = 1e-6    # a summed cost channel below this (p.u. x steps) counts as zero in the flip count


def device_line() -> str:
    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    memory = f", {stats['bytes_limit'] / 2**30:.1f} GiB" if stats and "bytes_limit" in stats else ""
    return f"{dev.platform.upper()} {dev.device_kind} x{jax.device_count()}{memory}; jax {jax.__version__}"


def task_env(task: str, layer: bool):
    from evogrid.envs import make
    from evogrid.safety import shield

    env, params = make(task)
    return (shield(env, params, "auto") if layer else env), params


def layer_choices(task: str, which: str = "both") -> tuple[bool, ...]:
    """(False, True) for a task with a safety layer, (False,) without one; `which` "off" / "on" keeps one."""
    from evogrid.envs import make
    from evogrid.safety import make_layer

    if which == "off":
        return (False,)
    env, params = make(task)
    layers = (False,) if make_layer(env, params, "auto") is None else (False, True)
    return layers if which == "both" else tuple(x for x in layers if x)


def build_rollout(env, params, n_envs: int, block: int | None = None):
    """jit(key, params) -> (obs, reward [N, T], costs [N, T, C], done): the peer's complete pattern (`block` steps an
    iteration of the loop, see `scan_rollout`)."""
    from evogrid.utils.jax_utils import batch_reset, scan_rollout, split_key_for_envs

    horizon, n_act = params.max_steps, env.action_space(params).shape[0]

    @jax.jit
    def run(key, params):
        k_reset, k_act, k_roll = jax.random.split(key, 3)
        _, states = batch_reset(env, split_key_for_envs(k_reset, n_envs), params)
        actions = jax.random.uniform(k_act, (n_envs, horizon, n_act), minval=-1.0, maxval=1.0)
        one = lambda s, k, a: scan_rollout(env, k, s, params, a, block)  # noqa: E731
        _, obs, reward, costs, done, _ = jax.vmap(one)(states, split_key_for_envs(k_roll, n_envs), actions)
        return obs, reward, costs, done

    return run


def block_rows(task: str, n_envs: int, repeats: int) -> list[str]:
    """Table rows of the bare rollouts at one step an iteration of their loop and at LOOP_BLOCK."""
    from evogrid.rollout import LOOP_BLOCK, make_random_rollout

    env, params = task_env(task, False)
    steps, rows = n_envs * params.max_steps, []
    for what, build in (("scan_rollout, every output", lambda b: build_rollout(env, params, n_envs, b)),
                        ("make_random_rollout", lambda b: make_random_rollout(env, params, n_envs, params.max_steps, b))):
        rates = [best_call(build(block), (params,), repeats) for block in (1, LOOP_BLOCK)]
        rows.append(f"| {task} | {what} | {n_envs:,} | {steps / rates[0][0]:,.0f} | {steps / rates[1][0]:,.0f} | "
                    f"{rates[0][0] / rates[1][0]:.2f} | {rates[0][1]:.1f}, {rates[1][1]:.1f} |")
    return rows


def best_call(run, args: tuple, repeats: int) -> tuple[float, float]:
    """(best seconds of `run(key, *args)` over `repeats` calls with keys 1.., seconds of the first call with
    key 0: compile + run)."""
    t0 = time.perf_counter()
    jax.block_until_ready(run(jax.random.key(0), *args))
    first, best = time.perf_counter() - t0, float("inf")
    for i in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(jax.random.key(i + 1), *args))
        best = min(best, time.perf_counter() - t0)
    return best, first


def env_rate(task: str, layer: bool, n_envs: int, repeats: int, block: int | None = None) -> tuple[float, float]:
    """(env-steps/s, compile s) of the rollout of `n_envs` envs."""
    env, params = task_env(task, layer)
    best, compile_s = best_call(build_rollout(env, params, n_envs, block), (params,), repeats)
    return n_envs * params.max_steps / best, compile_s


def agreement(task: str, layer: bool, n_envs: int) -> tuple[float, int, int, str]:
    """`differences` of the default device's rollout against the host CPU's, same keys and params."""
    env, params = task_env(task, layer)
    run = build_rollout(env, params, n_envs)
    key = jax.random.key(1)
    return differences(jax.device_get(run(key, params)), on_host(run, key, params))


def on_host(run, key, params):
    """`run(key, params)`'s outputs computed on the host CPU (NumPy arrays)."""
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        return jax.device_get(run(jax.device_put(key, cpu), jax.device_put(params, cpu)))


def differences(out, reference) -> tuple[float, int, int, str]:
    """(max relative return difference, cost sums flipped, cost sums compared, the first step whose reward
    differs by more than 1e-5 relative and that step's largest difference) of a rollout's outputs (obs, reward,
    costs, done) against a reference's."""
    (_, reward, costs, _), (_, reward_h, costs_h, _) = out, reference
    ret, ret_h = reward.sum(1).astype(np.float64), reward_h.sum(1).astype(np.float64)
    rel = float(np.max(np.abs(ret - ret_h) / np.maximum(np.abs(ret_h), 1e-12)))
    on, on_h = costs.sum(1) > ZERO_COST, costs_h.sum(1) > ZERO_COST
    step_rel = np.max(np.abs(reward - reward_h) / np.maximum(np.abs(reward_h), 1e-12), axis=0)   # [T]
    off = np.flatnonzero(step_rel > 1e-5)
    first = f"{off[0]} ({step_rel[off[0]]:.0e})" if off.size else "-"
    return rel, int(np.sum(on != on_h)), int(on.size), first


def ec_seconds(task: str, pop: int, safety: str, repeats: int) -> tuple[float, float]:
    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task=task, pop_size=pop, episodes_per_individual=1, obs_norm=False, safety=safety))
    return time_steps(wf, repeats)


def largest(task: str, probe: int) -> tuple[int, int, float]:
    """(largest `evogrid train` population, largest rollout env batch, MiB per 1,000 population members) that
    fit the device's memory (see `fits` in the module docstring)."""
    from evogrid.utils.memory import device_memory, largest_batch, memory_line, program_bytes
    from evogrid.workflows.registry import step_bytes

    limit = device_memory()
    env, params = task_env(task, False)

    def pop_bytes(n):
        return step_bytes({"task": task, "pop_size": n}, env, params)

    def env_bytes(n):
        return program_bytes(build_rollout(env, params, n).lower(jax.random.key(0), params))

    fixed, per = memory_line(pop_bytes, probe)
    pop = largest_batch(fixed, per, limit, 2 * jax.device_count())
    return pop, largest_batch(*memory_line(env_bytes, probe), limit), per * 1000 / 2**20


def train_loop(task: str, pop: int, generations: int, checkpoint_every: int) -> tuple[float, float, float]:
    """(first call s, post-compile s per generation, share of it in the compiled calls) of `learn` with a run
    directory, as `evogrid train --pop` runs it."""
    import tempfile

    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task=task, pop_size=pop))
    with tempfile.TemporaryDirectory() as run:
        wf.learn(wf.init(), generations, run_dir=run, checkpoint_every=checkpoint_every, progress=False)
    (_, first_in, first_out), *rest = wf.call_seconds
    inside, total = sum(c for _, c, _ in rest), sum(c + h for _, c, h in rest)
    done = sum(k for k, _, _ in rest)   # the generations after the first call
    return first_in + first_out, total / max(done, 1), inside / total if total else float("nan")


PRODUCT = re.compile(r"= \S+ (dot|convolution)\(")


def audit(task: str, layer: bool, n_envs: int) -> list[str]:
    """Each matrix product of the compiled rollout: 'kind precision source' (see the module docstring)."""
    env, params = task_env(task, layer)
    run = build_rollout(env, params, n_envs)
    text = run.lower(jax.random.key(0), params).compile().as_text()
    sources, rows = op_sources(text), {}
    for line in text.splitlines():
        m = PRODUCT.search(line)
        if not m:
            continue
        precision = re.search(r"operand_precision=\{([^}]*)\}", line)
        op = HLO_OP.match(line)
        src = sources.get(op.group(1), "? ? ?").split(" ", 1)[1] if op else "? ?"
        key = (m.group(1), precision.group(1) if precision else "default", src)
        rows[key] = rows.get(key, 0) + 1
    return [f"| {k[0]} | {k[1]} | {k[2]} | {n} |" for k, n in sorted(rows.items())]


HLO_OP = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = (\S+) .*?metadata=\{([^}]*)\}")


def op_sources(text: str) -> dict[str, str]:
    """HLO op name -> 'shape source:line op-name tail' from a compiled program's text: the source is the
    innermost evogrid frame of the op's stack (the program's FileNames / FileLocations / StackFrames tables)."""
    tables, section = {"FileNames": {}, "FileLocations": {}, "StackFrames": {}}, None
    for line in text.splitlines():
        if line in tables or line == "FunctionNames":
            section = line
        elif section and re.match(r"^\d+ ", line):
            key, rest = line.split(" ", 1)
            if section in tables:
                tables[section][key] = rest
        else:
            section = None

    def where(frame: str | None) -> str:
        for _ in range(64):   # innermost frame outwards
            if frame is None or frame not in tables["StackFrames"]:
                return "?"
            entry = tables["StackFrames"][frame]
            loc = tables["FileLocations"].get(re.search(r"file_location_id=(\d+)", entry).group(1), "")
            file_id = re.search(r"file_name_id=(\d+)", loc)
            file = tables["FileNames"].get(file_id.group(1), "").strip('"') if file_id else ""
            if "evogrid/" in file:
                return file.split("evogrid/")[-1] + ":" + re.search(r"line=(\d+)", loc).group(1)
            parent = re.search(r"parent_frame_id=(\d+)", entry).group(1)
            frame = None if parent == frame else parent
        return "?"

    out = {}
    for line in text.splitlines():
        m = HLO_OP.match(line)
        if m:
            frame = re.search(r"stack_frame_id=(\d+)", m.group(3))
            name = re.search(r'op_name="([^"]*)"', m.group(3))
            out[m.group(1)] = f"{m.group(2)[:40]} {where(frame.group(1) if frame else None)} {name.group(1)[-40:] if name else ''}"
    return out


def profile(task: str, layer: bool, n_envs: int, top: int, block: int | None = None) -> tuple[list[str], float, float]:
    """The `top` ops of the device's time in two traced calls of the task's rollout (see `profile_calls`)."""
    env, params = task_env(task, layer)
    return profile_calls(build_rollout(env, params, n_envs, block), (params,), n_envs * params.max_steps, top)


def profile_calls(run, args: tuple, steps: int, top: int) -> tuple[list[str], float, float]:
    """The `top` ops of the device's time in two traced calls `run(key, *args)` (a jitted function doing `steps`
    env-steps): rows 'op | share | us a call | events a call | shape, source, op name', the ops' total ms a
    call and the untraced calls' env-steps/s (see `profile` in the module docstring)."""
    import glob
    import tempfile

    sources = op_sources(run.lower(jax.random.key(0), *args).compile().as_text())
    best = best_call(run, args, 2)[0]
    with tempfile.TemporaryDirectory() as where:
        with jax.profiler.trace(where):
            for i in range(2):
                jax.block_until_ready(run(jax.random.key(i + 1), *args))
        data = jax.profiler.ProfileData.from_file(glob.glob(f"{where}/**/*.xplane.pb", recursive=True)[0])
        device = [p for p in data.planes if p.name.startswith("/device:")]
        lines = [ln for p in device for ln in p.lines if ln.name == "XLA Ops"] or \
                [ln for p in data.planes for ln in p.lines]
        total, count = {}, {}
        for ln in lines:   # a device's "XLA Ops" line names its events by their HLO text; a host's carry "hlo_op"
            for e in ln.events:
                stats = dict(e.stats)
                if ln.name != "XLA Ops" and "hlo_op" not in stats:
                    continue
                name = stats.get("hlo_op", e.name).split(" = ")[0].lstrip("%")
                if name.split(".")[0] in ("while", "conditional", "call"):   # their time is their bodies'
                    continue
                total[name] = total.get(name, 0.0) + e.duration_ns
                count[name] = count.get(name, 0) + 1
    whole = sum(total.values()) or 1.0
    rows = [f"| {name} | {ns / whole:.1%} | {ns / 2e3:,.0f} | {count[name] // 2} | {sources.get(name, '?')} |"
            for name, ns in sorted(total.items(), key=lambda x: -x[1])[:top]]
    return rows, whole / 2e6, steps / best


def resident_gib() -> float:
    """The process's resident host memory now, GiB (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 2**20
    except (OSError, StopIteration, ValueError):
        return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small sizes (any machine)")
    ap.add_argument("--parts", default="envs,agree,ec", help="comma-separated: envs, agree, ec, train, fits, audit, blocks, profile")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--sizes", default=None, help="env batch sizes (default 1024,16384; smoke 16)")
    ap.add_argument("--pops", default=None, help="ECWorkflow populations (default 1024,4096,16384; smoke 16)")
    ap.add_argument("--agree-envs", type=int, default=None, help="envs in the agreement rollout (default 256; smoke 4)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--generations", type=int, default=None, help="train part: generations (default 100; smoke 4)")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="train part: as `evogrid train` (default 20)")
    ap.add_argument("--layers", choices=("both", "off", "on"), default="both",
                    help="envs/agree parts: the bare env, the env behind its layer, or both (default)")
    ap.add_argument("--probe", type=int, default=64, help="fits part: the smaller batch compiled (default 64)")
    ap.add_argument("--budget", type=float, default=20.0, help="skip a task's larger sizes once one call takes this many s")
    ap.add_argument("--block", type=int, default=None, help="envs/profile parts: steps an iteration of the rollout's "
                    "loop (`evogrid.rollout.scan_steps`; default: its own, 8 on an accelerator, 1 on the CPU)")
    ap.add_argument("--top", type=int, default=15, help="profile part: how many ops to list (default 15)")
    ap.add_argument("--chord-precision", choices=("default", "highest"), default=None,
                    help="the AC chord method's corrections (physics.ac.CORRECTION_PRECISION; default: the library's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from evogrid.physics import ac
    if args.chord_precision:
        ac.CORRECTION_PRECISION = jax.lax.Precision[args.chord_precision.upper()]
    parts, tasks = args.parts.split(","), args.tasks.split(",")
    sizes = [int(x) for x in (args.sizes or ("16" if args.smoke else "1024,16384")).split(",")]
    pops = [int(x) for x in (args.pops or ("16" if args.smoke else "1024,4096,16384")).split(",")]
    n_agree = args.agree_envs or (4 if args.smoke else 256)
    lines = []

    def say(line=""):
        lines.append(line)
        print(line, flush=True)

    say(f"# {device_line()}; the AC chord's corrections at {ac.CORRECTION_PRECISION.name} precision")
    opened = resident_gib()   # the device runtime's own host memory (13 GiB on a TPU v5e host) is in from here
    if "envs" in parts:
        say(f"\n| task | layer | N envs | env-steps/s{f' ({args.block} steps a loop iteration)' if args.block else ''} | compile s |")
        say("|---|---|---|---|---|")
        for task in tasks:
            for layer in layer_choices(task, args.layers):
                for n in sizes:
                    rate, compile_s = env_rate(task, layer, n, args.repeats, args.block)
                    say(f"| {task} | {'on' if layer else 'off'} | {n:,} | {rate:,.0f} | {compile_s:.1f} |")
                    if n * 48 / rate > args.budget:
                        break
    if "agree" in parts:
        say(f"\n| task | layer | returns: max relative difference, device vs host CPU ({n_agree} envs) | cost sums flipped "
            "| first step off by > 1e-5 |")
        say("|---|---|---|---|---|")
        for task in tasks:
            for layer in layer_choices(task, args.layers):
                rel, flips, total, first = agreement(task, layer, n_agree)
                say(f"| {task} | {'on' if layer else 'off'} | {rel:.1e} | {flips} / {total} | {first} |")
    if "ec" in parts:
        say("\n| ECWorkflow Open_ES | safety | population | s / generation | env-steps/s | first generation (compile) s |")
        say("|---|---|---|---|---|---|")
        for task in [t for t in tasks if t in ("tso-case14", "tso-case118")] or tasks[:1]:
            for safety in ("off", "auto"):
                for pop in pops:
                    s, c = ec_seconds(task, pop, safety, args.repeats)
                    say(f"| {task} | {safety} | {pop:,} | {s:.4f} | {pop * 48 / s:,.0f} | {c:.1f} |")
    if "train" in parts:
        import resource

        generations = args.generations or (4 if args.smoke else 100)
        every = min(args.checkpoint_every, 2 if args.smoke else generations)   # smoke: calls after the first
        say(f"\n| evogrid train loop ({generations} generations, checkpoints every {every}) | population "
            "| first call s | s / generation after it | share in the compiled calls |")
        say("|---|---|---|---|---|")
        for task in [t for t in tasks if t.startswith("tso-")][:1] or tasks[:1]:
            for pop in pops:
                first, per_gen, share = train_loop(task, pop, generations, every)
                say(f"| {task} | {pop:,} | {first:.1f} | {per_gen:.4f} | {share:.0%} |")
        say(f"peak host memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB "
            f"({opened:.1f} GiB resident once the device was opened, before any task was built)")
    if "fits" in parts:
        from evogrid.utils.memory import device_memory

        if device_memory() is None:
            say("\nfits: the device does not say how much memory it holds; set EVOGRID_DEVICE_MEMORY (e.g. 16GiB)")
        else:
            say(f"\nfits in {device_memory() / 2**30:.1f} GiB of device memory:")
            say("| task | largest `evogrid train` population (4 episodes, layer on) | MiB per 1,000 members "
                "| largest rollout env batch |")
            say("|---|---|---|---|")
            for task in tasks:
                pop, envs, per = largest(task, args.probe)
                say(f"| {task} | {pop:,} | {per:,.0f} | {envs:,} |")
    if "audit" in parts:
        for task in tasks:
            say(f"\n{task}: matrix products of the compiled rollout ({sizes[0]} envs)")
            say("| op | precision | source, op name | count |")
            say("|---|---|---|---|")
            for row in audit(task, False, sizes[0]):
                say(row)
    if "blocks" in parts:
        from evogrid.rollout import LOOP_BLOCK

        say(f"\n| task | rollout | N envs | env-steps/s, 1 step an iteration | {LOOP_BLOCK} steps | ratio | compile s (1, {LOOP_BLOCK}) |")
        say("|---|---|---|---|---|---|---|")
        for task in tasks:
            for row in block_rows(task, sizes[0], args.repeats):
                say(row)
    if "profile" in parts:
        for task in tasks:
            for layer in layer_choices(task, args.layers):
                rows, ms, rate = profile(task, layer, sizes[0], args.top, args.block)
                say(f"\n{task}, layer {'on' if layer else 'off'}, {sizes[0]:,} envs ({rate:,.0f} env-steps/s): the device's "
                    f"ops, {ms:,.1f} ms a call")
                say("| op | share | us a call | events a call | shape, source, op name |")
                say("|---|---|---|---|---|")
                for row in rows:
                    say(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
