"""Optimisation baselines: what an operator would run instead of a learned policy, on the same days.

    report = baseline("tso-case14")          # the test days; cached after the first call
    report["oracle"]["cost"], report["myopic"]["return"], report["summary"]

Per task family (`evogrid baseline --task NAME` prints the same):
* TSO, DC (`tso.py`): the perfect-foresight multi-period DC-OPF of each day (security-constrained on the
  -n1 tasks), and the myopic policy that solves the one-step problem of the load it observes within ramp
  limits of its last dispatch. Replayed through the env: the replay equals the objective.
* DCMG (`dcmg.py`): a perfect-foresight LP lower bound on each day's cost (a relaxation of the env's
  rules, so a bound and not a schedule; no myopic policy).
* GenCos (`market.py`): the competitive reference, every company offering at cost: its prices and
  profits per day (a reference for bidding strategies, not an optimum of the flat reward).
* DSO and DERs (`feeder.py`): the day's perfect-foresight LinDistFlow QP (DERs: import at the tariff,
  batteries coupling the steps), its voltages corrected against the sweep power flow, the day replayed
  through the env (a good feasible schedule, not a proven optimum); the realisable baseline is the
  feeder with no control (zero action, no safety layer).
* The operator's baselines (`operators.py`, `baseline(task, operators=True)`), each with and without the
  task's safety layer: zero policy, persistence, myopic and rolling-horizon (MPC) DC-OPF on the
  observation's forecast on the DC transmission tasks; zero and persistence on the AC ones; no control
  and the rolling LinDistFlow dispatch (each interval's QP at the observed loads) on dso.
* TSO, AC (`ac.py`): the day's DC plan tracked step by step by PYPOWER's `runopf` (optional dependency)
  within ramp limits, as a reference (a local optimum, not a bound), its set-points replayed through the
  env; and beside it a bound (`ac_bound.py`): the day's multi-period SOC relaxation of the AC-OPF.

Costs are in the task's reward units (minus the return): a policy's gap to the oracle on a day is
(its cost - the oracle's) / the oracle's. Days on which no schedule meets every limit are reported
as infeasible, never as a number, and left out of gaps. Everything is solved in float64.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

from evogrid.physics import host_float64

from evogrid.baselines import ac, dcmg, feeder, market, tso  # noqa: F401  (each registers its family's reference)
from evogrid.baselines.report import (  # noqa: F401  (re-exported: the report readers)
    Reference,
    day_gaps,
    gap,
    policy_figures,
    reference_of,
    schedule_report,
    solved_days,
    summarise,
)
from evogrid.utils.rundir import atomic_write

BASELINE_VERSION = "19"  # bump when an oracle's formulation or a replayed env changes (invalidates cached reports)


def supported(task: str) -> bool:
    """Whether the task has a registered reference (every built-in family; on AC transmission tasks a
    per-step AC-OPF reference, not an oracle)."""
    return reference(task) is not None


KEY_BITS = 20    # a float leaf enters a cache key on a grid of 2^-20 of its largest entry


def _key_bytes(leaf) -> bytes:
    """A params leaf as it enters a cache key: integers and booleans as they are; floats (a complex leaf's
    real and imaginary parts together) as their largest finite magnitude rounded to KEY_BITS significant bits
    and each entry on a grid of 2^-KEY_BITS of it, the others (inf, NaN) as they are. The set-up's products
    (PTDFs, the loads' flows, inverse Jacobians) carry the host's round-off, ~1e-15 of the leaf's largest entry
    in every entry (zero ones too); another CPU (a TPU machine's host) computes other round-off, and on this
    grid it makes the same key (the chance that round-off straddles a grid point is ~1e-9 an entry, also for
    the small entries, where rounding each to its own significant bits is not safe). A change below 2^-20 of
    the leaf's largest entry makes none."""
    x = np.asarray(leaf)
    if not np.issubdtype(x.dtype, np.inexact):
        return x.tobytes()
    x = np.stack([x.real, x.imag]) if np.iscomplexobj(x) else x.astype(np.float64)
    finite = np.isfinite(x)
    top = float(np.max(np.abs(x[finite]), initial=0.0))
    mantissa, exponent = np.frexp(top)
    scale = np.ldexp(np.round(mantissa * 2.0 ** KEY_BITS) / 2.0 ** KEY_BITS, exponent)   # 1.0 whichever side
    grid = np.round(np.where(finite, x, 0.0) / (top or 1.0) * 2.0 ** KEY_BITS) + 0.0   # + 0.0: no -0.0
    return np.float64(scale).tobytes() + grid.tobytes() + np.where(finite, 0.0, x).tobytes()


def _cache_path(task: str, split: str, params, observed: bool = False) -> Path:
    """Keyed by the params' leaves (`_key_bytes`: rounded, so that another machine's set-up makes the same
    key), less the cached start-of-day states and observations (`init`, `init_obs`: computed from the other
    leaves on the default device, where a TPU rounds otherwise than a CPU) and, unless `observed`, the
    forecasts (a task with a forecast, -fc<H>, shares its oracle with the task without). With `observed`
    (what policies that read the observation did: the operator's baselines), the forecasts count."""
    import jax

    from evogrid.envs.registry import parse_task

    derived = ("init", "init_obs") + (() if observed else ("forecast",))
    params = params.replace(**{k: None for k in derived if hasattr(params, k)})
    if observed:
        task = f"{task.lower()}-operators"
    else:
        task = parse_task(task).without_forecast()
    digest = hashlib.sha256(BASELINE_VERSION.encode())
    for leaf in jax.tree_util.tree_leaves(params):
        digest.update(_key_bytes(leaf))
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evogrid" / "baselines"
    return root / f"{task}-{split}-{digest.hexdigest()[:16]}.json"


def baseline(task: str, split: str = "test", refresh: bool = False, operators: bool = False) -> dict:
    """The reference's figures of `task` on its `split` days (a dict, JSON-ready); cached on disk. With
    `operators`, also the operator's baselines with and without the safety layer (`operators.py`: report
    key "operators", name -> per-day figures; summary key "operators", name -> `policy_figures`), on the
    tasks that have them (transmission, DC and AC, and dso)."""
    report = _oracle_report(task, split, refresh)
    if operators and reference(task).operators:
        from evogrid.baselines.operators import operator_policies
        from evogrid.envs import make
        from evogrid.safety import shield

        with host_float64():
            env, params = make(task, split=split)
            path = _cache_path(f"{task}-{_layer_tag(shield(env, params))}", split, params, observed=True)
            if path.is_file() and not refresh:
                ops = json.loads(path.read_text())
            else:
                played = report.get("myopic") if report.get("oracle_kind") == "schedule" else None
                ops = operator_policies(env, params, progress=_progress,
                                        myopic=played if played and "decision_s" in played else None)
                atomic_write(path, json.dumps(ops, indent=1))
        report["operators"] = ops
        report["summary"]["operators"] = {name: policy_figures(report, v["return"], v["violation"], v["moved_mwh"])
                                          | {"decision_s": v["decision_s"]} for name, v in ops.items()}
    return report


def demonstrations(env, params, days, augment: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`operators.demonstrations` (the operator's MPC's observations and actions on `days` of `params`, with
    `augment` perturbed copies of each), cached on disk (.npz, keyed by the params' leaves, the days, the
    copies and the safety layer `env` carries, with its settings), with per-day progress on stderr."""
    from evogrid.baselines.operators import demonstrations as play

    days = list(days)
    layer = _layer_tag(env)
    tag = hashlib.sha256(str(days).encode()).hexdigest()[:8]
    copies = f"-{augment}copies" if augment else ""
    path = _cache_path(f"demonstrations-{layer}-{len(days)}days{copies}-{tag}", "mpc", params, observed=True)
    path = path.with_suffix(".npz")
    if path.is_file():
        with np.load(path, allow_pickle=False) as f:
            return f["obs"], f["actions"]
    obs, actions = play(env, params, days, _progress("the operator's MPC to imitate"), augment,
                        _progress(f"the operator's MPC on {augment} perturbed copies"))
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, obs=obs, actions=actions)
    atomic_write(path, buffer.getvalue())
    return obs, actions


def _layer_tag(env) -> str:
    """"raw", or the safety layer's name and a digest of its settings (its static fields: iterations,
    look-ahead, margins) and its `VERSION` (where a layer has one): the MPC played behind another layer made
    other observations."""
    import dataclasses

    from evogrid.safety import Shielded

    if not isinstance(env, Shielded):
        return "raw"
    settings = [(f.name, getattr(env.layer, f.name)) for f in dataclasses.fields(env.layer)
                if not f.metadata.get("pytree_node", True)]
    if hasattr(env.layer, "VERSION"):
        settings.append(("VERSION", env.layer.VERSION))
    return f"{type(env.layer).__name__}-{hashlib.sha256(repr(settings).encode()).hexdigest()[:8]}"


def reference(task: str) -> Reference | None:
    """The registered reference of a built-in task (`reference.Reference`), None for one without (or a
    name that is not a built-in task, e.g. gymnax)."""
    from evogrid.envs.registry import parse_task

    try:
        return reference_of(parse_task(task))
    except ValueError:
        return None


def _oracle_report(task: str, split: str, refresh: bool) -> dict:
    from evogrid.envs import make
    from evogrid.envs.registry import parse_task

    ref = reference(task)
    if ref is None:
        raise ValueError(f"no optimisation baseline for task {task!r}; baselines exist for the transmission "
                         "tasks (tso-case5, tso-case14, tso-case118-ac, tso-case14-n1, ...), dso-case33bw, "
                         "ders-case141, dcmg and the gencos tasks (competitive reference)")
    with host_float64():
        env, params = make(task, split=split)
        path = _cache_path(task, split, params)
        if path.is_file() and not refresh:
            return json.loads(path.read_text())
        built = ref.build(env, params, parse_task(task), _progress)
    report = {"task": task, "split": split, "return_unit": env.units(params)["return"], **built}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(report, indent=1))
    return report


def _progress(what: str):
    """`progress(done, total)` for a loop over days, on stderr: one line rewritten in place on a terminal,
    a plain line at each quarter of the days in a log."""
    tty = sys.stderr.isatty()
    start = "\r" if tty else ""

    def show(done, total):
        if not tty and done != total and (4 * done) // total == (4 * (done - 1)) // total:
            return
        print(f"{start}  {what}: day {done}/{total}", end="\n" if done == total or not tty else "", file=sys.stderr, flush=True)
    return show

