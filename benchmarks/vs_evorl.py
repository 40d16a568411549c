"""evogrid against EvoRL (EMI-Group, on PyPI as `evorl-jax`) on the same machine, in one run, interleaved.

    python benchmarks/vs_evorl.py           # pop 256, 3 rounds
    python benchmarks/vs_evorl.py --quick   # pop 64, 1 round

EvoRL is installed into a venv of its own (default `$XDG_CACHE_HOME/evogrid/evorl-venv`, made on the first
run: `evorl-jax[gymnax]` at EVORL_VERSION, with the jax/jaxlib of this project's venv so both sides run
the same XLA; nothing enters the project's venv). Each measurement is a fresh process (cold compile, no
persistent compilation cache) and the two frameworks alternate within each round; the table keeps each
figure's best round. Work on both sides:

* OpenES on gymnax Pendulum-v1 (200 steps, one episode per member, MLP 32x32, no observation
  normalisation, mirrored sampling, Adam 0.03, sigma 0.05): seconds per generation and the first
  generation's time (compile + run). Pendulum, not CartPole: EvoRL's ES agents take continuous
  actions only (`make_deterministic_ec_agent` asserts a Box action space).
* PPO on the same env, 16 envs x 48 steps per iteration, 4 epochs of 4 minibatches, MLPs 64x64:
  env steps per second over whole iterations (collect + learn) and the first iteration's time.

evogrid's side is its workflows (`ECWorkflow`, `RLWorkflow`) as a user runs them, with the validation
choice pushed past the measured steps; EvoRL's is its `OpenESWorkflow` / `PPOWorkflow.step` built from an
OmegaConf config with checkpointing off. Ratios are evogrid's figure over EvoRL's: for seconds, below 1
means evogrid is faster; for env steps per second, above 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path

EVORL_VERSION = "0.1.1"

EVORL_ES = """
import json, sys, time
import jax
from omegaconf import OmegaConf
from evorl.algorithms.ec.so.openes import OpenESWorkflow
pop, repeats = int(sys.argv[1]), int(sys.argv[2])
cfg = OmegaConf.create({
    "env": {"env_name": "Pendulum-v1", "env_type": "gymnax", "max_episode_steps": 200},
    "pop_size": pop, "num_envs": 1, "episodes_for_fitness": 1, "num_eval_envs": 1, "eval_episodes": 1,
    "agent_network": {"actor_hidden_layer_sizes": [32, 32], "use_bias": True, "norm_layer_type": "none", "policy_obs_key": ""},
    "normalize_obs": False, "explore": False, "discount": 1.0, "random_timesteps": 0,
    "ec_lr": {"init": 0.03, "final": 0.03, "decay": 1.0}, "ec_noise_std": {"init": 0.05, "final": 0.05, "decay": 1.0},
    "mirror_sampling": True, "weight_decay": 0.0, "optimizer_name": "adam", "num_iters": 10**6, "eval_interval": 10**6,
    "metric_names": {}, "seed": 0, "checkpoint": {"enable": False}, "output_dir": "/tmp/evorl-bench"})
wf = OpenESWorkflow.build_from_config(cfg, enable_jit=True)
state = wf.init(jax.random.PRNGKey(0))
step = lambda s: wf.step(s)[1]
"""

EVORL_PPO = """
import json, sys, time
import jax
from omegaconf import OmegaConf
from evorl.algorithms.ppo import PPOWorkflow
envs, rollout, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cfg = OmegaConf.create({
    "env": {"env_name": "Pendulum-v1", "env_type": "gymnax", "max_episode_steps": 200},
    "num_envs": envs, "rollout_length": rollout, "minibatch_size": envs * rollout // 4, "reuse_rollout_epochs": 4,
    "agent_network": {"actor_hidden_layer_sizes": [64, 64], "critic_hidden_layer_sizes": [64, 64], "policy_obs_key": "",
                      "value_obs_key": ""},
    "normalize_obs": False, "normalize_gae": True, "clip_epsilon": 0.2, "discount": 0.99, "gae_lambda": 0.95,
    "gae_horizon": rollout, "loss_weights": {"actor_loss": 1.0, "critic_loss": 0.5, "actor_entropy": 0.0},
    "optimizer": {"lr": 1e-3, "grad_clip_norm": 0.5}, "total_timesteps": 10**12, "eval_interval": 10**6,
    "num_eval_envs": 1, "eval_episodes": 1, "checkpoint": {"enable": False}, "output_dir": "/tmp/evorl-bench", "seed": 0})
wf = PPOWorkflow.build_from_config(cfg, enable_jit=True)
state = wf.init(jax.random.PRNGKey(0))
step = lambda s: wf.step(s)[1]
"""

EVOGRID_ES = """
import json, sys, time
import jax
from evogrid.workflows import ECConfig, ECWorkflow
pop, repeats = int(sys.argv[1]), int(sys.argv[2])
wf = ECWorkflow(ECConfig(task="gymnax:Pendulum-v1", algorithm="Open_ES", pop_size=pop, episodes_per_individual=1,
                         hidden=(32, 32), obs_norm=False, sigma=0.05, learning_rate=0.03, select_every=10**6))
state = wf.init()
step = lambda s: wf.step(s)[0]
"""

EVOGRID_PPO = """
import json, sys, time
import jax
from evogrid.workflows import PPOConfig, RLWorkflow
envs, rollout, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
wf = RLWorkflow(PPOConfig(task="gymnax:Pendulum-v1", num_envs=envs, rollout_len=rollout, hidden=(64, 64), epochs=4,
                          minibatches=4, learning_rate=1e-3, select_every=10**6))
state = wf.init()
step = lambda s: wf.step(s)[0]
"""

TIMING = """
t0 = time.perf_counter()
state = jax.block_until_ready(step(state))
first = time.perf_counter() - t0
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    state = jax.block_until_ready(step(state))
    times.append(time.perf_counter() - t0)
print("RESULT " + json.dumps({"first_s": first, "step_s": min(times)}))
"""


def evorl_python(path: Path) -> Path:
    """The EvoRL venv's interpreter, creating the venv on the first call."""
    py = path / "bin" / "python"
    stamp = path / f".installed-{EVORL_VERSION}"
    if stamp.exists():
        return py
    print(f"[vs_evorl] creating {path} with evorl-jax {EVORL_VERSION} (a few minutes, once)", flush=True)
    venv.EnvBuilder(with_pip=True).create(path)
    pins = [f"evorl-jax[gymnax]=={EVORL_VERSION}", f"jax=={metadata.version('jax')}", f"jaxlib=={metadata.version('jaxlib')}"]
    subprocess.run([str(py), "-m", "pip", "install", "-q", *pins], check=True)
    stamp.write_text(" ".join(pins))
    return py


def measure(python, code: str, args) -> dict:
    """Run `code` + TIMING in a fresh process; its RESULT line as a dict."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code + TIMING)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        out = subprocess.run([str(python), f.name, *map(str, args)], capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{python} failed:\n{out.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pop 64, one round")
    ap.add_argument("--venv", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "evogrid" / "evorl-venv", help="where EvoRL's own venv lives")
    args = ap.parse_args()
    pop, rounds, repeats = (64, 1, 5) if args.quick else (256, 3, 10)
    envs, rollout = 16, 48
    theirs = evorl_python(args.venv)
    ours = sys.executable
    work = {"es": (EVOGRID_ES, EVORL_ES, (pop, repeats)), "ppo": (EVOGRID_PPO, EVORL_PPO, (envs, rollout, repeats))}
    best: dict = {}
    for r in range(rounds):
        for name, (mine, other, a) in work.items():
            for side, python, code in (("evorl", theirs, other), ("evogrid", ours, mine)):
                got = measure(python, code, a)
                print(f"[vs_evorl] round {r + 1}/{rounds} {name} {side}: {got}", flush=True)
                old = best.get((name, side))
                best[(name, side)] = got if old is None else {k: min(old[k], got[k]) for k in got}
    steps = envs * rollout
    rows = [
        (f"OpenES s/generation (pop {pop}, Pendulum-v1 x 200 steps)", "es", "step_s", lambda x: x),
        ("OpenES first generation s (compile + run)", "es", "first_s", lambda x: x),
        (f"PPO env steps/s ({envs} envs x {rollout} steps, 4x4 minibatches)", "ppo", "step_s", lambda x: steps / x),
        ("PPO first iteration s (compile + run)", "ppo", "first_s", lambda x: x),
    ]
    print(f"\njax {metadata.version('jax')} on {os.cpu_count()} CPU cores; best of {rounds} round(s), interleaved\n")
    print(f"| measure | evogrid | EvoRL {EVORL_VERSION} | evogrid / EvoRL |")
    print("|---|---|---|---|")
    for label, name, key, f in rows:
        a, b = f(best[(name, "evogrid")][key]), f(best[(name, "evorl")][key])
        print(f"| {label} | {a:.4g} | {b:.4g} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
