"""The operator's baselines, each played with and without the task's safety layer (`evogrid.safety`).

On the DC transmission tasks: the zero policy (every unit at the middle of its ramp window), persistence
(every unit holds its last output; the automatic generation control follows the load), the myopic
one-step DC-OPF and the rolling-horizon DC-OPF (MPC) on the forecast the observation carries, re-solved
every interval (`tso.rolling_policy`). On the AC transmission tasks: the zero policy (mid-window dispatch,
mid-band voltages), persistence (the last outputs and voltages held) and the same rolling DC-OPF, its loads
raised by the losses' share it observes, the voltages held. On dso: the zero policy (no control)
and the rolling dispatch of the feeder (`feeder.rolling_policy`: each interval's LinDistFlow QP at the
observed loads). Each is judged as a learned policy is: every test day from its start, return, summed
cost channels, and the MWh the layer moved.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.baselines import feeder, tso
from evogrid.rollout import play_days


def day_figures(env, params, policy):
    """(returns [n], summed costs [n, C], MWh the safety layer moved [n]; zeros without one), float64, of
    `policy(obs) -> action` on every day of `params` (`rollout.play_days`, compiled once per call)."""
    from evogrid.safety import Shielded

    sums = ("layer_moved",) if isinstance(env, Shielded) else ()
    m = jax.jit(lambda: play_days(env, params, policy, info_sums=sums))()
    moved = m["layer_moved"] if sums else jnp.zeros_like(m["episode_return"])
    return tuple(np.asarray(x, np.float64) for x in (m["episode_return"], m["episode_cost"], moved))


def operator_policies(env, params, progress=None, myopic=None) -> dict:
    """name -> {"return", "violation" (summed over channels), "moved_mwh" (per day lists), "layer" (bool),
    "decision_s" (mean seconds per decision where an optimiser decides)} for every baseline of the task's
    family, with ("<name>+layer") and without the safety layer. `progress(what)` returns a per-day callback.
    `myopic`: the myopic DC-OPF's {"return", "violation", "decision_s"} without the layer where it was played
    already (the DC reference report's), taken instead of played again (at 9,241 buses ten minutes)."""
    from evogrid.envs.dist import DistGridEnv
    from evogrid.envs.trans import TransGridEnv, observation_layout, read_observation
    from evogrid.safety import shield

    zero = lambda obs: jnp.zeros(env.action_space(params).shape, obs.dtype)  # noqa: E731
    out = {}
    for layered in (False, True):
        played = shield(env, params) if layered else env
        tag = "+layer" if layered else ""

        def record(name, returns, costs, moved, decision_s=None):
            out[name + tag] = {"return": returns.tolist(), "violation": np.asarray(costs).sum(-1).tolist(),
                               "moved_mwh": moved.tolist(), "layer": layered, "decision_s": decision_s}

        record("zero", *day_figures(played, params, zero))
        if type(env) is TransGridEnv:
            layout = observation_layout(params)

            def hold(obs):   # on AC tasks the voltage-controlled buses held at their last |V| too
                seen = read_observation(obs, params, layout)
                vm = params.vbus_incidence @ seen["vm"] if params.voltage_control else None
                return tso.setpoint_action(params, seen["last_pg"], seen["last_pg"], vm)

            record("persistence", *day_figures(played, params, hold))
            if not params.ac and myopic is not None and not layered:   # its summed violation as the one channel
                returns = np.asarray(myopic["return"], np.float64)
                record("myopic", returns, np.asarray(myopic["violation"], np.float64)[:, None], np.zeros_like(returns),
                       myopic["decision_s"])
            elif not params.ac:   # the optimising baselines are DC-OPFs
                record("myopic", *tso.rolling_policy(played, params, 1, progress=progress and progress(f"myopic{tag} policy")))
        elif type(env) is not DistGridEnv:
            raise ValueError(f"no operator baselines for {type(env).__name__}")
        if has_mpc(env, params):
            record("mpc", *rolling_mpc(played, params, progress=progress and progress(f"mpc{tag} policy")))
    return out


def _unshielded(env):
    from evogrid.safety import Shielded

    return env.env if isinstance(env, Shielded) else env


def has_mpc(env, params) -> bool:
    """Whether the env's task has the operator's MPC (`rolling_mpc`): the transmission tasks and the dso
    feeders (not DERs, dcmg or the markets)."""
    from evogrid.envs.dist import DistGridEnv
    from evogrid.envs.trans import TransGridEnv

    inner = _unshielded(env)
    return type(inner) is TransGridEnv or (type(inner) is DistGridEnv and not hasattr(params, "battery"))


def decides_per_observation(env, params) -> bool:
    """Whether the task's MPC decides from one observation alone (dso: the intervals do not couple), so that
    it can label observations no day played (`demonstrations(augment=...)`)."""
    from evogrid.envs.dist import DistGridEnv

    return type(_unshielded(env)) is DistGridEnv and has_mpc(env, params)


def rolling_mpc(env, params, days=None, progress=None, record=None):
    """The task's MPC played on `days` (default: every day of `params`) through `env`: on DC transmission tasks
    (AC ones too) the rolling DC-OPF over the observation's whole forecast (`tso.rolling_policy`), on dso the rolling
    LinDistFlow dispatch (`feeder.rolling_policy`); their figures and `record` as they return them. A ValueError
    on a task with no MPC (`has_mpc`)."""
    from evogrid.envs.trans import TransGridEnv, observation_layout

    if not has_mpc(env, params):
        raise ValueError("no operator MPC on this task: it exists on the transmission tasks (tso-caseN, -n1, -ac) "
                         "and dso-case33bw")
    if type(_unshielded(env)) is TransGridEnv:
        return tso.rolling_policy(env, params, 1 + observation_layout(params)[0], days, progress, record)
    return feeder.rolling_policy(env, params, days, progress, record)


def demonstrations(env, params, days=None, progress=None, augment: int = 0, augment_progress=None):
    """(observations [N, obs_dim], actions [N, act_dim]) float32: every interval of `days` (default: every day
    of `params`) as the operator's MPC plays it (`rolling_mpc`) through `env` (with its safety layer when
    `Shielded`; the action recorded is the MPC's own, before the layer), then `augment` perturbed copies of
    each observation labelled by the MPC (`feeder.perturbed_demonstrations`; dso only, where the decision
    depends on the one observation). What a policy imitates to start from the operator's decisions
    (`ECConfig.init = "operator"`). A ValueError on a task with no MPC, or `augment` on a task other than dso."""
    if augment and not decides_per_observation(env, params):
        raise ValueError("perturbed demonstrations (init_augment) need an MPC whose decision depends on one "
                         "observation alone: dso-case33bw; the transmission MPC plans over the day's forecast")
    record = []
    rolling_mpc(env, params, days, progress, record)
    obs, actions = (np.stack(x).astype(np.float32) for x in zip(*record))
    if augment:
        more = feeder.perturbed_demonstrations(params, obs, augment, progress=augment_progress)
        obs, actions = np.concatenate([obs, more[0]]), np.concatenate([actions, more[1]])
    return obs, actions
