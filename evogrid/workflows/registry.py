"""One registry of workflows: algorithm name -> (config class, workflow class).

    config, workflow = build({"algorithm": "ppo", "task": "tso-case5"})
    config_class("Open_ES")              # ECConfig

Names are matched without regard to case, "_" or "-" ("openes", "cma-es" and "CMA_ES" are the
same), and a near miss gets a "did you mean". The `evogrid` command builds its options from
these config classes. Adding an algorithm: its module under `evogrid/algorithms/` plus one
`register` line below.
"""
from __future__ import annotations

import difflib

from evogrid.algorithms import PPO, SAC, TD3
from evogrid.utils.config import _norm   # one spelling rule for the CLI and the configs
from evogrid.workflows.apg import APGConfig, APGWorkflow
from evogrid.workflows.attack import AttackConfig, AttackWorkflow
from evogrid.workflows.coevo import CoevoConfig, CoevolutionWorkflow
from evogrid.workflows.ec import ALGORITHMS as EC_ALGORITHMS
from evogrid.workflows.ec import ECConfig, ECWorkflow
from evogrid.workflows.erl import ERL_ALGORITHMS, ERLConfig, ERLWorkflow
from evogrid.workflows.pareto import NSGA2Config, NSGA2Workflow
from evogrid.workflows.pbt import PBTWorkflow, pbt_config
from evogrid.workflows.qd import MAPElitesConfig, MAPElitesWorkflow
from evogrid.workflows.rl import RLWorkflow, rl_config

_REGISTRY: dict[str, tuple[str, type, type]] = {}  # normalised name -> (name, config class, workflow class)


def register(name: str, config_cls: type, workflow_cls: type) -> None:
    _REGISTRY[_norm(name)] = (name, config_cls, workflow_cls)


def algorithms() -> list[str]:
    return [name for name, _, _ in _REGISTRY.values()]


def resolve(name: str) -> tuple[str, type, type]:
    """(canonical name, config class, workflow class) of an algorithm name, or a ValueError naming the valid ones."""
    entry = _REGISTRY.get(_norm(str(name)))
    if entry is None:
        close = difflib.get_close_matches(_norm(str(name)), list(_REGISTRY), n=1, cutoff=0.6)
        hint = f"; did you mean {_REGISTRY[close[0]][0]}?" if close else ""
        raise ValueError(f"unknown algorithm {name!r}{hint} (choose one of {', '.join(algorithms())})")
    return entry


def config_class(name: str) -> type:
    return resolve(name)[1]


def build(values: dict, env=None, env_params=None):
    """(config, workflow) from a dict of config values with an `algorithm` key (default Open_ES)."""
    name, config_cls, workflow_cls = resolve(values.get("algorithm", "Open_ES"))
    config = config_cls.from_dict({**values, "algorithm": name})
    return config, workflow_cls(config, env, env_params)


def step_bytes(values: dict, env=None, env_params=None) -> int:
    """Device bytes that the compiled `step` of `build(values, env, env_params)`'s workflow needs (compiled,
    nothing allocated: `utils.memory.program_bytes`)."""
    from evogrid.utils.memory import program_bytes

    _, workflow = build(values, env, env_params)
    return program_bytes(type(workflow).step.lower(workflow, workflow.state_template()))


def load(run_dir):
    """(workflow, state, step) of a finished or interrupted run: the workflow its config.json builds and the
    state of its newest checkpoint (taken at `step`). Raises FileNotFoundError for a folder that is not a run
    or holds no checkpoint, ValueError for a damaged config.

        wf, state, step = evogrid.load("runs/cma5")
        print(wf.report(state))      # the chosen policy on the test days, as `evogrid eval` prints it
    """
    import json
    from pathlib import Path

    from evogrid.utils.checkpoint import Checkpointer

    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"{run} is not a run directory (no config.json); pass the --out of `evogrid train`")
    try:
        values = json.loads((run / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{run / 'config.json'}: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{run / 'config.json'} holds a {type(values).__name__}, not an object of config keys")
    config, workflow = build(values)
    restored = Checkpointer(run / "checkpoints", config.to_dict(), defaults=config.defaults()).restore_latest(
        workflow.state_template())
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {run / 'checkpoints'}")
    step, state = restored
    return workflow, state, step


for _name in EC_ALGORITHMS:
    register(_name, ECConfig, ECWorkflow)
register("ppo", rl_config(PPO), RLWorkflow)
register("td3", rl_config(TD3), RLWorkflow)
register("sac", rl_config(SAC), RLWorkflow)
register("pbt", pbt_config(PPO, "pbt", ("learning_rate", "ent_coef", "lagrange_ki")), PBTWorkflow)
register("pbt_td3", pbt_config(TD3, "pbt_td3", ("learning_rate", "expl_noise", "lagrange_ki")), PBTWorkflow)
for _name in ERL_ALGORITHMS:
    register(_name, ERLConfig, ERLWorkflow)
register("apg", APGConfig, APGWorkflow)
register("map_elites", MAPElitesConfig, MAPElitesWorkflow)
register("nsga2", NSGA2Config, NSGA2Workflow)
register("coevo", CoevoConfig, CoevolutionWorkflow)
register("attack", AttackConfig, AttackWorkflow)
