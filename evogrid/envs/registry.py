"""Named tasks: `make("tso-case14")` -> (env, params).

Names are "<task>-case<name>" with an optional suffix on transmission tasks: "-ac" for the AC
Newton-Raphson mode, "-n1" for the security task (N-1 screening channel and random line outages,
TSO_SUFFIXES), e.g. "tso-case5", "tso-case118-ac", "tso-case14-n1". Keyword arguments go to the
task's `make_*_params` (and override the suffix's).
"""
from __future__ import annotations

from evogrid.case import list_cases

RADIAL_FEEDERS = ("33bw", "141")  # distribution feeders: DSO/DERs tasks, not TSO dispatch
TSO_SUFFIXES = {"ac": {"ac": True}, "n1": {"n1": True, "outages_per_day": 2.0}}
_TASKS = {}  # prefix -> (env class, params factory, case names it accepts)


def register(prefix: str, env_cls, make_params, cases=None):
    """`cases=None`: a task without a grid case, named by the bare prefix ("dcmg")."""
    _TASKS[prefix] = (env_cls, make_params, None if cases is None else tuple(cases))


def list_tasks() -> list[str]:
    names = []
    for prefix, (_, _, cases) in _TASKS.items():
        if cases is None:
            names.append(prefix)
        for c in cases or ():
            names += [f"{prefix}-case{c}"] + ([f"{prefix}-case{c}-{x}" for x in TSO_SUFFIXES] if prefix == "tso" else [])
    return names


def make(name: str, **kwargs):
    """Build a named task: returns (env, params). "gymnax:<id>" wraps a gymnax environment."""
    if name.startswith("gymnax:"):
        from evogrid.envs.gymnax_adapter import GymnaxEnv

        unknown = sorted(set(kwargs) - {"max_steps", "split"})  # no days: every split is the same environment
        if unknown:
            raise ValueError(f"gymnax tasks take only max_steps (and split, which they ignore), got {', '.join(unknown)}")
        env = GymnaxEnv(name.split(":", 1)[1])
        return env, env.default_params(kwargs.get("max_steps"))
    if name.lower() in _TASKS and _TASKS[name.lower()][2] is None:
        env_cls, make_params, _ = _TASKS[name.lower()]
        return env_cls(), make_params(**kwargs)
    parts = name.lower().split("-")
    suffix = parts.pop() if len(parts) == 3 else None
    if len(parts) == 2 and parts[0] in _TASKS and _TASKS[parts[0]][2] and parts[1].startswith("case"):
        env_cls, make_params, cases = _TASKS[parts[0]]
        case = parts[1].removeprefix("case")
        if case in cases and (suffix is None or (parts[0] == "tso" and suffix in TSO_SUFFIXES)):
            return env_cls(), make_params(case, **{**TSO_SUFFIXES.get(suffix, {}), **kwargs})
    import difflib

    shown = ", ".join(n for n in list_tasks() if n.count("-") == 1 or "-case" not in n)
    close = difflib.get_close_matches(name.lower(), list_tasks(), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ValueError(f"unknown task {name!r}{hint} (known tasks: {shown}; append '-ac' to a tso task for the AC power-flow mode, '-n1' for N-1 security; "
                     "'gymnax:<id>' for a gymnax environment)")


def _register_builtin():
    from evogrid.envs.trans import TransGridEnv, make_trans_params

    register("tso", TransGridEnv, make_trans_params, [c for c in list_cases() if c not in RADIAL_FEEDERS])
    from evogrid.envs.dist import DistGridEnv, make_dist_params

    register("dso", DistGridEnv, make_dist_params, ["33bw"])
    from evogrid.envs.ders import DEREnv, make_der_params

    register("ders", DEREnv, make_der_params, ["141"])
    from evogrid.envs.dcmg import DCMicrogridEnv, make_dcmg_params

    register("dcmg", DCMicrogridEnv, make_dcmg_params)
    from evogrid.envs.market import GenCoMarketEnv, make_market_params

    register("gencos", GenCoMarketEnv, make_market_params, ["5", "14"])


_register_builtin()
