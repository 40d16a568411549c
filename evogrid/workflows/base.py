"""The `Workflow` base: seeded `init`, jitted `step(state)` / `evaluate(state)`, and the Python `learn` loop.

`learn` is the only Python in a run: it calls the compiled `step` once per generation, appends
the metrics (vectors flattened to one named scalar each, e.g. `cost:thermal`) to the run
directory (utils/rundir.py: JSONL, CSV, TensorBoard), shows progress, and checkpoints the whole
state every `checkpoint_every` generations and at the end. With `resume=True` it continues from
the newest checkpoint, bit-identically to an uninterrupted run: the state carries the PRNG key,
and the metrics file is cut back to the restored generation. Every check (config of the
checkpoints, the directory) happens before anything is written. With several processes
(`jax.distributed`), every process runs the loop and takes part in checkpointing; only
process 0 writes metrics and progress.
"""
from __future__ import annotations

import contextlib
import math
import re
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.envs import make
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.rollout import play_days, rollout
from evogrid.utils.checkpoint import Checkpointer
from evogrid.utils.jax_utils import jit_method
from evogrid.utils.rundir import RunDir, flatten_row

EVAL_SEED = 0      # evaluation's step keys: the same episodes whatever the run's seed or length
FEASIBLE_TOL = 1e-6  # a day is feasible when each of its summed cost channels is at most this


def met_every_limit(costs):
    """Whether each day met every limit: every cost channel (last axis) at most FEASIBLE_TOL."""
    return jnp.all(costs <= FEASIBLE_TOL, axis=-1)


def better(a, b):
    """Feasibility first: policy a beats b when it misses fewer days, or as many and violates less (by more
    than FEASIBLE_TOL), or as little and earns more. a, b: (missed days, mean violation, return) over the
    same days."""
    (miss_a, viol_a, ret_a), (miss_b, viol_b, ret_b) = a, b
    return jnp.where(miss_a != miss_b, miss_a < miss_b,
                     jnp.where(jnp.abs(viol_a - viol_b) <= FEASIBLE_TOL, ret_a > ret_b, viol_a < viol_b))


@struct.dataclass
class Chosen:
    """The validation record of the policy a run keeps (every workflow chooses its policy this way).

    Candidates are played on the validation days and compared with the kept policy feasibility first
    (`better`: fewer days missed, then less violation, then the score) on the days some policy played so
    far has met every limit on (`seen`); on the other days,
    which may have no feasible schedule at all (tso-case5 has one such validation day, dso-case33bw
    about half, by the oracle), violation is weighed against the return as training weighs it: the
    score is the mean return minus those days' costs times the constraint mechanism's current weights
    (`Lagrangian.weights`). Once a policy meets a day, the day counts first for every policy, the
    kept one included; days missed come before the violation's size. Why neither the violation alone
    nor the return alone: docs/design/choices.md."""

    ret: jnp.ndarray        # mean validation return of the kept policy (-inf before the first choice)
    day_cost: jnp.ndarray   # [n_val, C] its summed cost per channel on each validation day (+inf before)
    seen: jnp.ndarray       # [n_val] bool: some policy played so far met every limit on that day

    @classmethod
    def create(cls, n_days: int, n_costs: int, dtype=None) -> Chosen:
        dtype = dtype or jnp.zeros(()).dtype
        return cls(jnp.asarray(-jnp.inf, dtype), jnp.full((n_days, n_costs), jnp.inf, dtype), jnp.zeros((n_days,), bool))

    def scores(self, ret, day_cost, weights):
        """(days missed, violation, score) of returns [...] and day costs [..., n_val, C]: how many of the days
        met so far this policy misses, its mean summed violation per day over those days, and its mean
        return less the weighted costs of the days not yet met."""
        weighted = jnp.sum(jnp.where(weights > 0, day_cost * weights, 0.0), axis=-1)
        score = ret - jnp.mean(jnp.where(self.seen, 0.0, weighted), axis=-1)
        missed = jnp.sum(self.seen & ~met_every_limit(day_cost), axis=-1)
        return missed, jnp.mean(jnp.where(self.seen, jnp.sum(day_cost, axis=-1), 0.0), axis=-1), score

    def consider(self, ret, day_cost, weights):
        """(index of the winner among K candidates, or -1 when the kept policy stays; the new record), from
        the candidates' mean returns [K], costs per validation day [K, n_val, C] and the constraint weights
        [C] (return units per unit of cost)."""
        record = self.replace(seen=self.seen | jnp.any(met_every_limit(day_cost), axis=0))
        scores = record.scores(ret, day_cost, weights)
        best = record.scores(self.ret, self.day_cost, weights)
        winner, best_ret, best_days = jnp.int32(-1), self.ret, self.day_cost
        for k in range(ret.shape[0]):
            mine = tuple(x[k] for x in scores)
            win = better(mine, best) | jnp.isneginf(best_ret)
            winner = jnp.where(win, k, winner)
            best = tuple(jnp.where(win, x, y) for x, y in zip(mine, best))
            best_ret, best_days = jnp.where(win, ret[k], best_ret), jnp.where(win, day_cost[k], best_days)
        return winner, record.replace(ret=best_ret.astype(self.ret.dtype), day_cost=best_days.astype(self.day_cost.dtype))

    def metrics(self) -> dict:
        """val_return, val_violation (mean summed violation over every validation day) and val_counted_days
        (the days some policy has met)."""
        return {"val_return": self.ret, "val_violation": jnp.mean(jnp.sum(self.day_cost, axis=-1)),
                "val_counted_days": jnp.sum(self.seen).astype(jnp.float32)}


class Workflow:
    """Subclasses implement `_init(key)`, `_step(state)`, `_evaluate(state)`. `self.config` is a frozen config
    (utils/config.py) with `task` and `seed`. One `step` of any workflow is a "generation" (an ES generation, an
    RL iteration, an APG update), the one name of the CLI's `--generations` and of the metrics rows' key."""

    config_type: type | None = None   # the config class (or a base of it) this workflow is built from

    @classmethod
    def check_config(cls, config):
        """`config`, or a one-line refusal naming the workflow and config to use instead."""
        if cls.config_type is None or isinstance(config, cls.config_type):
            return config
        from evogrid.workflows.registry import resolve

        try:
            _, config_cls, workflow_cls = resolve(getattr(config, "algorithm", ""))
            hint = f"; {type(config).__name__} ({config.algorithm}) goes to {workflow_cls.__name__}"
        except ValueError:
            hint = ""
        raise TypeError(f"{cls.__name__} is built from {cls.config_type.__name__} (or a subclass), got "
                        f"{type(config).__name__}{hint}")

    def __init__(self, config, env=None, env_params=None):
        """`env`/`env_params` default to the task's training days (`make(task, split="train")`); validation
        and test days are built from the task when first needed. With your own params, validation and
        evaluation use them too. With the config's `safety` on (or "auto" on a task that has one) the
        task's safety layer stands between every policy the workflow plays and the env (`evogrid.safety`);
        `self.layer_on` says whether it does; `self.own_params` whether you passed the env."""
        from evogrid.safety import MARGINS, Shielded, shield
        from evogrid.utils.jax_utils import keep_compiled_programs

        keep_compiled_programs()   # as the CLI: programs compiled once are kept on disk (EVOGRID_COMPILE_CACHE=0: off)
        self.config = config = self.check_config(config)
        self.own_params = env is not None
        if env is None:
            env, env_params = make(config.task, split="train")
        if not isinstance(env, Shielded):
            env = shield(env, env_params, getattr(config, "safety", "off"),
                         **{name: getattr(config, name, 0.0) for name in MARGINS})
        self.layer_on = isinstance(env, Shielded)
        self.env, self.env_params = env, env_params
        self.obs_dim = env.observation_space(env_params).shape[0]
        self.act_dim = env.action_space(env_params).shape[0]
        self.cost_names = tuple(env.constraint_names(env_params))
        self._splits = {}

    @property
    def choice_split(self) -> str:
        """The days the reported policy is chosen on: "val" or "train+val" (config field `select_on`)."""
        return getattr(self.config, "select_on", "val")

    def split_params(self, split: str):
        """The params of the task's "val", "train+val" or "test" days (the training params when you passed
        your own)."""
        if self.own_params:
            return self.env_params
        if split not in self._splits:
            with jax.ensure_compile_time_eval():
                self._splits[split] = make(self.config.task, split=split)[1]
        return self._splits[split]

    def init(self, key=None):
        """The initial run state; `key` defaults to `jax.random.key(config.seed)`. Also builds the validation
        days (outside any compiled function), which `step` uses; the test days are built when `evaluate`
        first needs them (one set-up fewer before the first generation)."""
        self.split_params(self.choice_split)
        return self._init(jax.random.key(self.config.seed) if key is None else key)

    def state_template(self):
        """A run state shaped as `init`'s, to restore a checkpoint into (its values are not used): `init()`
        by default; a workflow whose start is costly to compute overrides it (ECWorkflow's fit to the
        operator's MPC)."""
        return self.init()

    @jit_method()
    def step(self, state):
        """One generation / iteration as one compiled call: -> (state, metrics)."""
        return self._step(state)

    @jit_method(static_argnums=(3,))
    def steps(self, state, n, size: int):
        """`n` steps (1 <= n <= size; traced) in one compiled call: (state, metrics with a leading [size]
        axis, rows past n unused). A `while_loop` with a traced trip count, so every n runs the same
        compiled program: results do not depend on how a run is cut into calls (tested)."""
        shapes = jax.eval_shape(lambda s: self._step(s)[1], state)
        buf = jax.tree_util.tree_map(lambda x: jnp.zeros((size, *x.shape), x.dtype), shapes)

        def body(carry):
            i, s, buf = carry
            s, metrics = self._step(s)
            return i + 1, s, jax.tree_util.tree_map(lambda b, x: b.at[i].set(x), buf, metrics)

        _, state, buf = jax.lax.while_loop(lambda c: c[0] < n, body, (jnp.int32(0), state, buf))
        return state, buf

    def lower_steps(self, state, checkpoint_every: int):
        """`steps` as `learn(..., checkpoint_every=checkpoint_every)` calls it, lowered for `state`: its
        `.compile()` leaves the run's program in JAX's persistent compilation cache (`keep_compiled_programs`),
        so the run that follows does not compile it again (the CLI's memory check reads it)."""
        return type(self).steps.lower(self, state, jnp.int32(1), _steps_per_call(checkpoint_every))

    @jit_method()
    def evaluate(self, state):
        return self._evaluate(state)

    def config_dict(self) -> dict:
        return self.config.to_dict()

    def metric_names(self) -> dict:
        """Names of the entries of vector metrics (used to flatten them into named columns)."""
        return {"cost_channels": self.cost_names, "multiplier": self.cost_names}

    def play_days(self, policy, params):
        """Per-day figures of `policy(obs) -> action` over every day of `params`, each from its start of
        day, deterministically: (returns [n_days], summed costs [n_days, C]). Tasks without days (gymnax)
        play `eval_episodes` seeded episodes instead."""
        key = jax.random.key(EVAL_SEED)
        if self.env.num_days(params) is None:
            env = TrainingWrapper(self.env, self.config.eval_episodes)
            metrics, _ = rollout(env, policy, key, params.max_steps, params, obs_moments=False)
        else:
            metrics = play_days(self.env, params, policy, key=key)
        return metrics["episode_return"], metrics["episode_cost"]

    def report(self, state, operators: bool = True):
        """The chosen policy on every test day (`evaluate`) as a labelled `workflows.report.Report`: each figure
        with its unit, the gap to the task's oracle and (`operators`) the operator's baselines under this run's
        safety setting (computed once per task and cached). `print()` it for the table `evogrid eval` prints."""
        from evogrid.workflows.report import report

        return report(self, self.evaluate(state), operators)

    def validation_score(self, policy):
        """(mean return, summed cost per channel of each validation day [n_val, C]) of a policy."""
        returns, costs = self.play_days(policy, self.split_params(self.choice_split))
        return returns.mean(), costs

    def new_chosen(self, dtype=None) -> Chosen:
        """The empty validation record (`Chosen`) for this task's validation days."""
        n_days = self.env.num_days(self.split_params(self.choice_split))
        return Chosen.create(self.config.eval_episodes if n_days is None else n_days, len(self.cost_names), dtype)

    def evaluate_policy(self, policy) -> dict:
        """Test-day figures of `policy(obs) -> action`: every test day played once from its start of day.
        return / return_std over days, cost_channels (mean summed cost per channel), feasible_share (share
        of days with every channel at most FEASIBLE_TOL), and the per-day day_return / day_cost /
        day_feasible."""
        returns, costs = self.play_days(policy, self.split_params("test"))
        feasible = met_every_limit(costs)
        return {"return": returns.mean(), "return_std": returns.std(), "cost_channels": costs.mean(0),
                "feasible_share": feasible.mean(), "day_return": returns, "day_cost": costs.sum(-1),
                "day_feasible": feasible}

    def plot_evaluation(self, result: dict, run_dir: Path) -> list:
        """Figures of an evaluation (`evogrid eval` writes `result` and calls this): [(what, path)] of the files
        written into `run_dir`; none by default (MAP-Elites draws its archive, NSGA-II its front)."""
        return []

    def chosen_policy(self, state):
        """`policy(obs) -> action` of the run's chosen policy (the one `evaluate` reports)."""
        raise NotImplementedError(f"{type(self).__name__} has no single policy to trace")

    @jit_method()
    def trace_day(self, state, day):
        """The chosen policy over test day `day`, step by step: the env's `grid_view` after each step
        ([max_steps, ...] arrays), plus "reward" and "costs"."""
        params = self.split_params("test")
        policy = self.chosen_policy(state)
        obs, env_state = self.env.reset_to_day(day, params)

        def one(carry, key):
            obs, env_state = carry
            obs, env_state, reward, costs, _, _ = self.env.step_env(key, env_state, policy(obs), params)
            return (obs, env_state), {**self.env.grid_view(env_state, params), "reward": reward, "costs": costs}

        keys = jax.random.split(jax.random.key(EVAL_SEED), params.max_steps)
        return jax.lax.scan(one, (obs, env_state), keys)[1]

    def _init(self, key):
        raise NotImplementedError

    def _step(self, state):
        raise NotImplementedError

    def _evaluate(self, state):
        raise NotImplementedError

    def learn(self, state, generations: int, run_dir: str | Path | None = None, checkpoint_every: int = 10,
              resume: bool = False, progress: bool = True, wandb_project: str | None = None,
              steps_per_call: int | None = None):
        """Run until `generations` steps have been taken in total. Returns (state, history).

        `state`: the run state to start from; None for `init()`'s, or with `resume` the newest checkpoint's
        where there is one (restored into `state_template()`: a resumed run does not compute its start again).

        Steps run up to `steps_per_call` at a time in one compiled call (`steps`; default: the largest
        divisor of the checkpoint interval up to MAX_STEPS_PER_CALL, so calls end on checkpoints; one
        program whatever the count, and the same results whatever `steps_per_call`). Metrics are per
        step (the wall time within a call is spread evenly over its steps); a stop request takes effect
        at the end of a call.

        SIGINT (Ctrl-C) or SIGTERM during the run finish the current step, write a checkpoint and the CSV,
        and end the loop early; `self.interrupted` then says so (the CLI prints how to resume).
        Metrics go to the run directory (JSONL, CSV, TensorBoard) and, with `wandb_project`, to Weights &
        Biases (the optional `wandb` package; its WANDB_MODE=offline works), one run per run directory."""
        history: list[dict] = []
        if wandb_project:
            if run_dir is None:
                raise ValueError("wandb_project needs a run_dir (the W&B run is named after it)")
            _wandb_module()  # before anything is written
        primary = jax.process_index() == 0
        progress = progress and primary
        run = ckpt = None
        start = 0
        if run_dir is not None:
            run = RunDir(run_dir)
            if primary:  # other processes may already see the directory process 0 is creating
                run.check_writable(resume)
            ckpt = Checkpointer(run.path / "checkpoints", self.config_dict(), defaults=self.config.defaults())
            saved = ckpt.steps()
            restored = None
            if resume and saved:   # the newest checkpoint whose generations all have their metrics rows
                complete = run.complete_through()
                upto = complete if any(s <= complete for s in saved) else None   # none: keep every checkpoint
                restored = ckpt.restore_latest(self.state_template() if state is None else state,
                                               log=_say if progress else None, upto=upto)
                if upto is None and restored is not None and restored[0] > complete and primary:
                    _say(f"warning: metrics rows of generations {complete + 1}-{restored[0]} are missing from "
                         f"{run.path / 'metrics.jsonl'}; resuming from the checkpoint of generation {restored[0]}")
            if not resume and saved:
                raise FileExistsError(f"{run.path} already holds checkpoints; pass resume=True (--resume) or use a new directory")
            if restored is not None:
                start, state = restored
                history = run.read_history(start)
            if primary:  # every check passed: now the directory may change
                run.claim(self.config_dict())
                run.write_history(history)
            if progress and restored:
                _say(f"resumed from generation {start} in {run.path}")
            elif resume and primary:   # one warning line, also with progress off
                _say(f"warning: nothing to resume in {run.path} (no checkpoint); starting from scratch")
        if state is None:
            state = self.init()
        files = run is not None and primary
        sinks = _Sinks(_tensorboard(run.path, start) if files else None,
                       _wandb_run(run.path, wandb_project, self.config_dict()) if files and wandb_project else None)
        bar = Progress(start, generations, self.env.units(self.env_params)["return"]) if progress else None
        names = self.metric_names()
        self.interrupted = False
        with _stop_requests() as stop:
            per_call = steps_per_call or _steps_per_call(checkpoint_every)
            state, history = self._loop(state, history, start, generations, run, ckpt, files, sinks, bar, names,
                                        checkpoint_every, stop, per_call)
        if bar is not None:
            bar.close()
        if files:
            run.write_csv(history)
        sinks.close()
        return state, history

    def _loop(self, state, history, start, generations, run, ckpt, files, sinks, bar, names, checkpoint_every, stop,
              per_call):
        t0 = time.perf_counter() - (history[-1].get("wall_s", 0.0) if history else 0.0)  # wall time across resumes
        gen = start
        self.call_seconds = []   # per compiled call: (its steps, its wall s with the results pulled, the host's s after it)
        while gen < generations:
            k = min(per_call - gen % per_call, generations - gen)  # calls end on multiples of per_call
            t_call = time.perf_counter() - t0
            state, metrics = self.steps(state, jnp.int32(k), per_call)
            bad = _first_nan(state)
            if bad is not None:
                where = f"generation {gen + 1}" + (f"-{gen + k}" if k > 1 else "")
                raise FloatingPointError(f"{where}: the run state holds NaN in {bad} (the search diverged); "
                                         f"the last checkpoint before it is kept; try a smaller step size or sigma")
            metrics = _to_python(metrics)
            t_end = time.perf_counter() - t0
            for i in range(k):
                row = {"generation": gen + i + 1, **flatten_row({n: v[i] for n, v in metrics.items()}, names),
                       "wall_s": t_call + (i + 1) / k * (t_end - t_call)}
                history.append(row)
                if files:
                    run.append(row)
                sinks.log(row, gen + i + 1)
            done = gen = gen + k
            stopping = stop()  # read once: a signal arriving between two reads must not skip the checkpoint
            if ckpt is not None and (done % checkpoint_every == 0 or done == generations or stopping):
                ckpt.save(done, state)
            if bar is not None:
                bar.update(done, row, k)
            self.call_seconds.append((k, t_end - t_call, time.perf_counter() - t0 - t_end))
            if stopping:
                self.interrupted = True
                _say(f"stopped after generation {done} on request; checkpoint written")
                break
        return state, history


MAX_STEPS_PER_CALL = 50


def _steps_per_call(checkpoint_every: int) -> int:
    """`learn`'s default steps a compiled call: the largest divisor of the checkpoint interval up to
    MAX_STEPS_PER_CALL (calls end on checkpoints)."""
    return _divisor_at_most(checkpoint_every, MAX_STEPS_PER_CALL)


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is at most cap (calls of that many steps end on every n-th step)."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


@jax.jit
def _nan_flags(state):
    return [jnp.any(jnp.isnan(x)) for x in jax.tree_util.tree_leaves(state) if jnp.issubdtype(x.dtype, jnp.inexact)]


def _first_nan(state) -> str | None:
    """The path of the first state field holding NaN, or None (one fused reduction, then a small host copy)."""
    flags = np.asarray(jax.device_get(_nan_flags(state)))
    if not flags.any():
        return None
    paths = [jax.tree_util.keystr(p) for p, x in jax.tree_util.tree_leaves_with_path(state)
             if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return paths[int(np.argmax(flags))]


@contextlib.contextmanager
def _stop_requests():
    """Within the block, SIGINT and SIGTERM set a flag (the learn loop stops after the current step) instead of
    raising; outside the main thread, or where signals cannot be set, nothing changes."""
    flag = {"stop": False}

    def handler(signum, frame):
        if flag["stop"]:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        flag["stop"] = True
        _say("stopping after this step (Ctrl-C again to stop at once)")

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield lambda: flag["stop"]
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _say(message: str) -> None:
    print(f"[evogrid] {message}", file=sys.stderr, flush=True)


def _tensorboard(run_dir: Path, start: int):
    """A tensorboardX writer (None when it is not installed); on resume, events after `start` are purged."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tb"), purge_step=start + 1 if start else None, flush_secs=10)


class _Sinks:
    """The optional metric writers of a run: TensorBoard and Weights & Biases (either may be None)."""

    def __init__(self, tb, wandb_run):
        self.tb, self.wandb = tb, wandb_run

    def log(self, row: dict, step: int):
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "generation"}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self):
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _wandb_module():
    try:
        import wandb
    except ImportError:
        raise ValueError("W&B logging needs the wandb package: pip install wandb (or pip install -e '.[wandb]')") from None
    return wandb


def _wandb_run(run_dir: Path, project: str, config: dict):
    """A W&B run for the run directory: its id is the directory's name, so a resumed run continues it."""
    wandb = _wandb_module()
    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.name)[-64:]
    return wandb.init(project=project, id=run_id, name=run_dir.name, dir=str(run_dir), config=config, resume="allow")


def _to_python(metrics) -> dict:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.item() if v.ndim == 0 else v.tolist()
    return out


# what progress shows, in the run's return unit: the training days' mean return, the validation return of the policy
# kept so far (what chooses it; once there is one) and the summed cost
SHOWN = {"return": "return", "val_return": "kept policy's val return", "cost_total": "cost"}


class Progress:
    """Progress of a run on stderr: the first step (compile + run) is reported on its own, rate and ETA
    come from the steady-state steps after it. On a terminal a tqdm bar (80 columns); in a log a
    plain line every 5% of the run."""

    def __init__(self, start: int, total: int, return_unit: str = ""):
        self.start, self.total, self.return_unit = start, total, return_unit
        self.t0 = time.perf_counter()
        self.t_first = None
        self.tty = sys.stderr.isatty()
        self.bar = None

    def update(self, done: int, row: dict, steps: int = 1) -> None:
        """`steps` steps ended at `done` (one compiled call); `row` is the last one's metrics."""
        now = time.perf_counter()
        shown = {label: f"{row[k]:.4g}" for k, label in SHOWN.items()
                 if isinstance(row.get(k), (int, float)) and math.isfinite(row[k])}
        if self.t_first is None:
            self.t_first, self.first_done = now, done
            what = "first generation" if steps == 1 else f"first {steps} generations"
            _say(f"{what} (compile + run) took {now - self.t0:.1f} s"
                 + (f"; returns in {self.return_unit}" if self.return_unit else ""))
            if self.tty:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, initial=done, unit="gen", ncols=80, file=sys.stderr,
                                dynamic_ncols=False, leave=True)
            return
        if self.bar is not None:
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(steps)
            return
        step = max(1, (self.total - self.start) // 20)
        if done == self.total or (done - self.start) // step != (done - steps - self.start) // step:
            rate = (now - self.t_first) / max(done - self.first_done, 1)
            text = "  ".join(f"{k} {v}" for k, v in shown.items())
            _say(f"generation {done}/{self.total}  {text}  {rate:.3g} s/gen  ETA {rate * (self.total - done):.0f} s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
