"""Bad input gets a one-line error that names the field and what is allowed, and changes nothing on disk."""
import json
import math
import os

import jax.numpy as jnp
import pytest

from evogrid import cli
from evogrid.case import CaseFormatError, load_case, parse_matpower
from evogrid.envs import make, make_trans_params
from evogrid.workflows import APGConfig, CoevoConfig, ECConfig, ECWorkflow, MAPElitesConfig, PPOConfig

SMALL = ["--task", "tso-case5", "--pop", "4", "--episodes", "1", "--hidden", "4", "--checkpoint-every", "1", "--safety", "off"]


@pytest.mark.parametrize("build, message", [
    (lambda: ECConfig(sigma=math.nan), r"sigma must be a finite number, got nan"),
    (lambda: ECConfig(learning_rate=math.inf), r"learning_rate must be a finite number, got inf"),
    (lambda: PPOConfig(gamma=1.5), r"gamma must be in \[0.0, 1.0\], got 1.5"),
    (lambda: PPOConfig(learning_rate=math.nan), r"learning_rate must be a finite number, got nan"),
    (lambda: ECConfig(algorithm="GA", mutation_rate=1.5), r"mutation_rate must be in \[0.0, 1.0\], got 1.5"),
    (lambda: ECConfig(algorithm="Sep_CMA_ES", learning_rate=0.1),
     r"learning_rate is not used by Sep_CMA_ES \(it is an option of Open_ES, SNES, xNES, PGPE, ARS\); leave it unset"),
    (lambda: ECConfig(algorithm="Open_ES", elite=2), r"elite is not used by Open_ES \(it is an option of GA\)"),
    (lambda: CoevoConfig(strategy="CMA_ES", learning_rate=0.2), r"learning_rate is not used by CMA_ES"),
    (lambda: MAPElitesConfig(mutation_rate=0.5), r"mutation_rate is not used by map_elites \(it is an option of GA\)"),
    (lambda: APGConfig(sigma=0.1), r"sigma is not used by apg \(it is an option of Open_ES, "),
    (lambda: ECConfig(hidden=(0,)), r"hidden must be in \[1, inf\], got 0"),
    (lambda: ECConfig(hidden=(-4,)), r"hidden must be in \[1, inf\], got -4"),
    (lambda: ECConfig(constraint="lagrange"), r"constraint must be one of lagrangian, penalty, none, got 'lagrange'"),
    (lambda: ECConfig.from_dict({"pop_size": "8"}), r"pop_size must be an integer, got '8'"),
    (lambda: ECConfig.from_dict({"hidden": 32}), r"hidden must be a list of integers, got 32"),
    (lambda: ECConfig.from_dict({"hidden": "32"}), r"hidden must be a list of integers, got '32'"),
    (lambda: ECConfig.from_dict({"sigma": None}), r"sigma must be a number, got None"),
    (lambda: ECConfig.from_dict([1, 2]), r"must be given as an object of key: value pairs, got list"),
    (lambda: make("dcmg", max_steps=-3), r"max_steps must be an integer >= 1 \(steps per episode\), got -3"),
    (lambda: make("dso-case33bw", max_steps=0), r"max_steps must be an integer >= 1"),
    (lambda: make("gencos-case5", max_steps=0), r"max_steps must be an integer >= 1"),
    (lambda: make("tso-case5", n_days=0), r"n_days must be an integer >= 1 \(days of profiles\), got 0"),
    (lambda: make("tso-case5", delta_t_hours=math.nan), r"delta_t_hours must be a positive number of hours"),
])
def test_bad_values_name_the_field_and_the_range(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def _case_text(mutate):
    """case5 as MATPOWER text with one matrix entry changed."""
    from pathlib import Path

    import evogrid.case as case_pkg

    lines = (Path(case_pkg.__file__).parent / "data" / "case5.m").read_text().splitlines()
    return "\n".join(mutate(lines))


def _set_gen(lines, row, col, value):
    start = next(i for i, line in enumerate(lines) if "mpc.gen = [" in line)
    parts = lines[start + 1 + row].split()
    parts[col] = value
    lines[start + 1 + row] = "\t".join(parts[:-1]) + "\t" + parts[-1]
    return lines


@pytest.mark.parametrize("col, value, message", [
    (8, "NaN", r"mpc.gen row 1, column 9 is NaN"),
    (9, "500", r"generator row 1 has Pmin 500 and Pmax 40 MW; both must be finite with Pmin <= Pmax"),
])
def test_malformed_generator_data_is_refused(col, value, message):
    with pytest.raises(CaseFormatError, match=message):
        parse_matpower(_case_text(lambda ls: _set_gen(ls, 0, col, value)), "case5")


def test_case_file_errors(tmp_path):
    from evogrid.case.matpower import BUS_TYPE

    with pytest.raises(ValueError, match="is a directory; pass a MATPOWER .m case file"):
        load_case(tmp_path)
    case = load_case("5")
    case.bus[3, BUS_TYPE], case.bus[1, BUS_TYPE] = 2, 3  # the reference moves to bus 2, which has no generator
    with pytest.raises(ValueError, match="reference bus 2 has no in-service generator"):
        make_trans_params(case)


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_refused_commands_change_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "2", "--out", str(run))
    assert code == 0, err
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    # a resume with another config is refused, and config.json is left as it was
    code, _, err = _run(capsys, "train", *SMALL, "--sigma", "0.2", "--generations", "3", "--out", str(run), "--resume")
    assert code == 2 and "these options differ from it: sigma (0.05 there, 0.2 here)" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # a fresh run into an existing run, into a folder of the user's, or under a file
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "metrics.csv").write_text("the user's own data")
    (tmp_path / "afile").write_text("x")
    for argv, message in (([*SMALL, "--out", str(run)], "already holds checkpoints"),
                          ([*SMALL, "--out", str(tmp_path / "mine")], "non-empty folder that is not an evogrid run"),
                          ([*SMALL, "--out", str(tmp_path / "afile" / "sub")], "is not a writable directory")):
        code, _, err = _run(capsys, "train", *argv, "--generations", "2")
        assert code == 2 and message in err and err.count("\n") == 1, err
    assert (tmp_path / "mine" / "metrics.csv").read_text() == "the user's own data"


@pytest.mark.slow
@pytest.mark.parametrize("flag, field, asked, multiple, extra, what", [
    ("--pop", "pop_size", 2048, 2, {"episodes_per_individual": ("--episodes", 1)}, "one generation"),
    ("--envs", "num_envs", 4096, 4, {"algorithm": ("--algorithm", "PPO")}, "one iteration"),   # in PPO's minibatches
])
def test_a_batch_too_large_for_the_device_is_refused_with_the_largest_that_fits(tmp_path, capsys, monkeypatch, flag,
                                                                                  field, asked, multiple, extra, what):
    """On a device that says how much memory it holds (here EVOGRID_DEVICE_MEMORY: a CPU says nothing), a
    --pop (or, for the RL algorithms, --envs) whose step would not fit is refused in one line naming the
    largest that does, before the run starts (no run directory); that batch's step does fit, the asked one's
    does not (each compiled at its size), and 1.5x the one named would not."""
    from evogrid.utils.memory import program_bytes
    from evogrid.workflows.registry import build

    (key, (option, value)), = extra.items()   # one config value, and the option that sets it
    small = ["--task", "tso-case5", "--hidden", "8", "--safety", "off", "--generations", "1", option, str(value)]
    monkeypatch.setenv("EVOGRID_DEVICE_MEMORY", "4MiB")
    code, _, err = _run(capsys, "train", *small, flag, str(asked), "--out", str(tmp_path / "run"))
    assert code == 2 and err.count("\n") == 1, err
    assert f"{flag} {asked:,} on tso-case5 ({what}) needs about" in err and "the device holds 4 MiB" in err, err
    fits = int(err.split(f"the largest {flag} that fits is about ")[1].replace(",", "").strip())
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("EVOGRID_DEVICE_MEMORY", "12 potatoes")
    code, _, err = _run(capsys, "train", *small, flag, str(asked), "--out", str(tmp_path / "run"))
    assert code == 2 and "EVOGRID_DEVICE_MEMORY='12 potatoes': give bytes" in err and err.count("\n") == 1, err

    values = {"task": "tso-case5", "hidden": (8,), "safety": "off", key: value}

    def need(n):
        _, wf = build({**values, field: n})
        return program_bytes(type(wf).step.lower(wf, wf.state_template()))
    limit = 4 * 2**20
    assert fits % multiple == 0 and need(fits) <= limit < need(asked), (fits, need(fits))
    assert need(fits * 3 // 4 * 2) > limit, (fits, need(fits * 3 // 4 * 2))


def _generations(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]   # strict JSON
    csv_rows = (run / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in csv_rows] == [r["generation"] for r in rows]
    return [r["generation"] for r in rows]


@pytest.mark.slow
def test_resume_before_the_run_directory_exists_starts_the_run(tmp_path, capsys):
    """A run killed in its first second (before its directory exists) restarts with the same --resume command."""
    run = tmp_path / "never-started"
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "2", "--out", str(run), "--resume", "--quiet")
    assert code == 0, err
    assert err.count("warning: nothing to resume") == 1 and "Traceback" not in err
    assert _generations(run) == [1, 2]


@pytest.mark.slow
def test_resume_after_a_torn_middle_row_rebuilds_it(tmp_path, capsys):
    """Row 2 torn (a damaged file: row 3 and the checkpoint of generation 3 stand): the resume goes back to the
    newest checkpoint whose rows are complete (1) and every generation's row is there once."""
    run = tmp_path / "run"
    assert _run(capsys, "train", *SMALL, "--generations", "3", "--checkpoint-every", "1", "--out", str(run))[0] == 0
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "4", "--checkpoint-every", "1", "--out", str(run),
                        "--resume")
    assert code == 0, err
    assert "resumed from generation 1" in err and "ahead of the metrics rows" in err
    assert _generations(run) == [1, 2, 3, 4]


@pytest.mark.slow
def test_resume_after_a_torn_metrics_line(tmp_path, capsys):
    """A kill during an append, in a run whose rows an older version wrote (`return_mean`, today `return`)."""
    run = tmp_path / "run"
    assert _run(capsys, "train", *SMALL, "--generations", "2", "--out", str(run))[0] == 0
    old = (run / "metrics.jsonl").read_text().replace('"return":', '"return_mean":')
    (run / "metrics.jsonl").write_text(old + '{"generation": 3, "fitness_m')
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "3", "--out", str(run), "--resume")
    assert code == 0, err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in rows] == [1, 2, 3]
    assert all("return" in r and "return_mean" not in r for r in rows)
    assert (run / "metrics.csv").read_text().splitlines()[0].split(",").count("return") == 1


@pytest.mark.slow
@pytest.mark.parametrize("config_text, message", [
    ("{not json", "cannot evaluate"),
    (json.dumps({"algorithm": "Open_ES", "popsize": 8}), "unknown config key(s) popsize"),
    (json.dumps([1, 2]), "not an object of config keys"),
    (json.dumps({"algorithm": "Open_ES", "task": "tso-case5", "pop_size": 4, "episodes_per_individual": 1,
                 "hidden": [4], "sigma": 0.3, "safety": "off"}), "different config (differs in: sigma)"),
])
def test_eval_of_a_damaged_run_is_one_line(tmp_path, capsys, config_text, message):
    run = tmp_path / "run"
    assert _run(capsys, "train", *SMALL, "--generations", "1", "--out", str(run))[0] == 0
    (run / "config.json").write_text(config_text)
    code, _, err = _run(capsys, "eval", str(run))
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_nan_in_the_search_state_stops_the_run_naming_generation_and_field(tmp_path):
    env, params = make("tso-case5", max_steps=4, n_days=2)

    class Broken(ECWorkflow):
        def fitness(self, returns, costs, lagrangian):
            return jnp.where(returns < jnp.inf, jnp.nan, returns)  # every fitness NaN

    wf = Broken(ECConfig(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), safety="off"), env, params)
    with pytest.raises(FloatingPointError, match=r"generation 1: the run state holds NaN in \.es_state"):
        wf.learn(wf.init(), 3, run_dir=tmp_path / "r", checkpoint_every=1, progress=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_out_is_refused(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "1", "--out", str(locked / "run"))
    assert code == 2 and "is not a writable directory" in err


def test_ac_task_bad_input(monkeypatch, capsys, tmp_path):
    """Voltage set-point actions on a DC task, an AC task on a case without reactive data, and the AC
    reference without PYPOWER: one clear line each."""
    import dataclasses
    import sys

    from evogrid.case.matpower import QD, QMAX, QMIN

    with pytest.raises(ValueError, match="voltage set-point actions need the AC model"):
        make_trans_params("14", n_days=2, voltage_control=True)
    case = load_case("5")
    bus, gen = case.bus.copy(), case.gen.copy()
    bus[:, QD], gen[:, QMIN], gen[:, QMAX] = 0.0, 0.0, 0.0
    with pytest.raises(ValueError, match="case5 has no reactive data"):
        make_trans_params(dataclasses.replace(case, bus=bus, gen=gen), n_days=2, ac=True)
    monkeypatch.setitem(sys.modules, "pypower.api", None)   # as if PYPOWER were not installed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # no cached report to fall back on
    assert cli.main(["baseline", "--task", "tso-case5-ac"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == 'evogrid: the AC-OPF reference needs PYPOWER: pip install -e ".[oracles]"'


def test_setpoint_outputs_off_the_transmission_tasks_are_one_line(tmp_path, capsys):
    code, _, err = _run(capsys, "train", "--task", "dso-case33bw", "--policy-output", "setpoint", "--generations", "1",
                        "--out", str(tmp_path / "run"))
    assert code == 2 and "policy_output='setpoint' outputs the units' set-points, on transmission tasks" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_options_without_a_command_train(tmp_path, capsys):
    """`evogrid --task tso-case5 ...` is `evogrid train --task tso-case5 ...` (what `dev.py run ARGS` calls)."""
    run = tmp_path / "run"
    code, out, err = _run(capsys, *SMALL, "--generations", "1", "--out", str(run), "--quiet")
    assert code == 0, err
    assert "Open_ES on tso-case5" in out and _generations(run) == [1]
    with pytest.raises(SystemExit) as exited:   # --help alone is the command list, not train's options
        cli.main(["--help"])
    assert exited.value.code == 0 and "With no command" in capsys.readouterr().out


def test_workflow_configs_of_the_wrong_family_are_refused_in_one_line():
    from evogrid.workflows import ECConfig, ECWorkflow, PPOConfig, RLConfig, RLWorkflow

    with pytest.raises(ValueError, match="algorithm must be one of ppo, td3, sac, got 'sacc'"):
        RLConfig(algorithm="sacc")
    with pytest.raises(TypeError, match=r"RLWorkflow is built from RLConfig .* ECConfig \(Open_ES\) goes to ECWorkflow"):
        RLWorkflow(ECConfig())
    with pytest.raises(TypeError, match=r"ECWorkflow is built from ECConfig .* PPOConfig \(ppo\) goes to RLWorkflow"):
        ECWorkflow(PPOConfig())


@pytest.mark.slow
def test_rlworkflow_builds_the_learner_a_bare_rlconfig_names():
    from evogrid.workflows import RLConfig, RLWorkflow, TD3Config

    wf = RLWorkflow(RLConfig(task="tso-case5", algorithm="td3", num_envs=2))
    assert type(wf.config) is TD3Config and wf.config.num_envs == 2 and wf.agent.name == "td3"


def test_configs_take_the_clis_spellings_and_share_the_default_task():
    from evogrid.workflows import ECConfig, ERLConfig, PPOConfig, RLConfig

    assert ECConfig(algorithm="open-es").algorithm == ECConfig(algorithm="OpenES").algorithm == "Open_ES"
    assert RLConfig(algorithm="PPO").algorithm == "ppo"
    assert ECConfig().task == PPOConfig().task == ERLConfig().task == RLConfig().task


@pytest.mark.slow
def test_resume_with_the_metrics_file_lost_keeps_the_checkpoints(tmp_path, capsys):
    """No checkpoint has complete rows (metrics.jsonl deleted): the newest checkpoint is still taken, with a
    warning, not thrown away."""
    run = tmp_path / "run"
    assert _run(capsys, "train", *SMALL, "--generations", "2", "--out", str(run))[0] == 0
    (run / "metrics.jsonl").unlink()
    code, _, err = _run(capsys, "train", *SMALL, "--generations", "3", "--out", str(run), "--resume")
    assert code == 0, err
    assert "resumed from generation 2" in err and "generations 1-2 are missing" in err
    assert _generations(run) == [3]
