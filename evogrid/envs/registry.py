"""Named tasks: `make("tso-case14")` -> (env, params).

Names are "<task>-case<name>" (or "dcmg") with optional suffixes: on transmission tasks "-ac" for the
AC Newton-Raphson mode, "-n1" for the security task (N-1 screening channel and random line outages,
TSO_SUFFIXES); on every task "-real" for the shipped year of real profiles with calendar splits
(`profiles="real"`, see evogrid.data) and "-fc<H>" for a noisy forecast of the next H steps in the
observation (`forecast_steps=H`), e.g. "tso-case5", "tso-case118-ac", "tso-case14-n1-real",
"dcmg-real", "dso-case33bw-real-fc4". Keyword arguments go to the task's `make_*_params` (and override the suffixes').
"""
from __future__ import annotations

import dataclasses

from evogrid.case import LARGE_CASES, list_cases

RADIAL_FEEDERS = ("33bw", "141")  # distribution feeders: DSO/DERs tasks, not TSO dispatch
TSO_SUFFIXES = {"ac": {"ac": True, "enforce_q_limits": True}, "n1": {"n1": True, "outages_per_day": 2.0}}
SUFFIXES = {"real": {"profiles": "real"}}  # every task: the shipped year of real profiles (evogrid.data)
_TASKS = {}  # prefix -> (env class, params factory, case names it accepts)
FAMILIES = {"tso": "transmission dispatch",
            "dso": "distribution voltage control on a radial feeder (safety layer: voltage correction)",
            "ders": "batteries, PV and flexible loads on a radial feeder",
            "dcmg": "data-centre microgrid, 288 five-minute steps",
            "gencos": "generation companies bidding into a cleared market"}
SUFFIX_TEXT = {"ac": "AC Newton-Raphson power flow with reactive limits, voltage set-point actions, safety layer: voltage schedule", "n1": "N-1 screening and random line outages",
               "real": "the shipped year of real profiles, calendar splits"}


def register(prefix: str, env_cls, make_params, cases=None):
    """`cases=None`: a task without a grid case, named by the bare prefix ("dcmg")."""
    _TASKS[prefix] = (env_cls, make_params, None if cases is None else tuple(cases))


def list_tasks() -> list[str]:
    names = []
    for prefix, (_, _, cases) in _TASKS.items():
        if cases is None:
            names.append(prefix)
        for c in cases or ():
            with_suffixes = prefix == "tso" and c not in LARGE_CASES
            names += [f"{prefix}-case{c}"] + ([f"{prefix}-case{c}-{x}" for x in TSO_SUFFIXES] if with_suffixes else [])
    names += [f"{n}-{x}" for n in names for x in SUFFIXES]
    return names


@dataclasses.dataclass(frozen=True)
class TaskName:
    """A parsed task name: family ("tso"), case ("14", or None for "dcmg"), its suffixes in the order
    given, and the `make_*_params` keyword arguments they set."""
    family: str
    case: str | None
    suffixes: tuple
    options: dict

    def without_forecast(self) -> str:
        """The name less its -fc<H> suffix (a forecast changes the observation, not the task's physics)."""
        parts = [self.family] + ([f"case{self.case}"] if self.case else [])
        return "-".join(parts + [x for x in self.suffixes if not _is_forecast(x)])


def _is_forecast(suffix: str) -> bool:
    return suffix[:2] == "fc" and suffix[2:].isdigit()


def parse_task(name: str) -> TaskName:
    """Split a built-in task name into its parts, refusing unknown ones with the valid names and a
    did-you-mean hint (gymnax names are not parsed here)."""
    prefix, *parts = name.lower().split("-")
    if prefix in _TASKS:
        cases = _TASKS[prefix][2]
        case = None
        if cases is not None and parts and parts[0].startswith("case") and parts[0].removeprefix("case") in cases:
            case = parts.pop(0).removeprefix("case")
        known = {**(TSO_SUFFIXES if prefix == "tso" else {}), **SUFFIXES,
                 **{x: {"forecast_steps": int(x[2:])} for x in parts if _is_forecast(x)}}
        one_each = len(set(parts)) == len(parts) and sum(map(_is_forecast, parts)) <= 1
        if case in LARGE_CASES and set(parts) & set(TSO_SUFFIXES):
            raise ValueError(f"{name}: the AC (-ac) and N-1 (-n1) modes are for the IEEE cases (up to 118 buses); "
                             f"the pglib-opf grids of real size ({', '.join(LARGE_CASES)}) are DC dispatch tasks "
                             f"(tso-case{case}, with -real or -fc<H> if wanted)")
        if (case is None) == (cases is None) and one_each and all(x in known for x in parts):
            return TaskName(prefix, case, tuple(parts), {k: v for x in parts for k, v in known[x].items()})
    import difflib

    shown = ", ".join(n for n in list_tasks() if n.count("-") == 1 or "-case" not in n)
    close = difflib.get_close_matches(name.lower(), list_tasks(), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ValueError(f"unknown task {name!r}{hint} (known tasks: {shown}; append '-ac' to a tso task for the AC power-flow mode, '-n1' for N-1 security, "
                     "'-real' to any task for real profiles, '-fc<H>' for an H-step forecast; "
                     "'gymnax:<id>' for a gymnax environment)")


def describe(name: str) -> str:
    """One line on what a built-in task name means."""
    task = parse_task(name)
    parts = [FAMILIES[task.family]] + ([f"case {task.case}"] if task.case else [])
    if task.family == "tso" and "ac" not in task.suffixes:
        parts.append("DC power flow, safety layer: security redispatch")
    parts += [f"{x[2:]}-step forecast" if _is_forecast(x) else SUFFIX_TEXT[x] for x in task.suffixes]
    return ", ".join(parts)


def make(name: str, **kwargs):
    """Build a named task: returns (env, params). "gymnax:<id>" wraps a gymnax environment."""
    if name.startswith("gymnax:"):
        from evogrid.envs.gymnax_adapter import GymnaxEnv

        unknown = sorted(set(kwargs) - {"max_steps", "split"})  # no days: every split is the same environment
        if unknown:
            raise ValueError(f"gymnax tasks take only max_steps (and split, which they ignore), got {', '.join(unknown)}")
        env = GymnaxEnv(name.split(":", 1)[1])
        return env, env.default_params(kwargs.get("max_steps"))
    task = parse_task(name)
    env_cls, make_params, _ = _TASKS[task.family]
    return env_cls(), make_params(*([] if task.case is None else [task.case]), **{**task.options, **kwargs})


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
