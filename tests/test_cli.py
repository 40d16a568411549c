"""The `evogrid` command: train/eval end to end, and a real killed-and-resumed run that ends bit-identical."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import metrics_rows

# the safety layer off: these tests are about runs, checkpoints and resumes (the layer's are in test_safety)
ARGS = ["--task", "tso-case5", "--pop", "8", "--episodes", "1", "--hidden", "8", "--checkpoint-every", "20", "--safety", "off"]
TOTAL = 200


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "evogrid.cli", *args], capture_output=True, text=True, timeout=600, **kw)


def _restore(run: Path):
    from evogrid.utils.checkpoint import Checkpointer
    from evogrid.workflows import build

    config, wf = build(json.loads((run / "config.json").read_text()))
    return Checkpointer(run / "checkpoints", config.to_dict()).restore_latest(wf.init())


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One uninterrupted run of ARGS for TOTAL generations: what the interrupted runs must end identical to."""
    run = tmp_path_factory.mktemp("full") / "run"
    full = _cli("train", *ARGS, "--generations", str(TOTAL), "--out", str(run))
    assert full.returncode == 0, full.stderr
    return run


@pytest.mark.slow
def test_killed_run_resumes_bit_identically(tmp_path, full_run):
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "evogrid.cli", "train", *ARGS, "--generations", str(TOTAL),
                             "--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "40").exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before it could be interrupted"
        time.sleep(0.005)
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up, no final checkpoint
    proc.wait()
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    assert len(lines) < TOTAL
    resumed = _cli("train", *ARGS, "--generations", str(TOTAL), "--out", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from generation" in resumed.stderr
    assert metrics_rows(killed / "metrics.jsonl") == metrics_rows(full_run / "metrics.jsonl")
    (step_a, state_a), (step_b, state_b) = _restore(full_run), _restore(killed)
    assert step_a == step_b == TOTAL
    for a, b in zip(jax.tree_util.tree_leaves(state_a), jax.tree_util.tree_leaves(state_b)):
        np.testing.assert_array_equal(a, b)
    # eval replays the best policy of the run
    ev = _cli("eval", str(killed), "--plot", "--day", "2")
    assert ev.returncode == 0 and "evaluation of the chosen policy" in ev.stdout and "cost_channels:balance" in ev.stdout
    assert (killed / "grid_day2.png").stat().st_size > 1000  # the grid over test day 2
    bad_day = _cli("eval", str(killed), "--plot", "--day", "99")
    assert bad_day.returncode == 2 and "--day must be in [0, 16)" in bad_day.stderr
    units = json.loads((killed / "eval.json").read_text())["units"]  # every figure with its unit
    assert units["return"] == "k$ per day (minus generation cost)" and "k$ per day" in ev.stdout
    assert "p.u. of baseMVA" in units["cost_channels:thermal"] and units["gap_to_oracle_pct"] == "% of the oracle's cost"
    assert (killed / "learning_curve.png").stat().st_size > 1000 and (killed / "metrics.csv").exists()
    assert list((killed / "tb").glob("events.out.tfevents.*"))  # TensorBoard scalars


@pytest.mark.parametrize("args, message", [
    (["train", "--algorithm", "OpenEZ"], "unknown algorithm 'OpenEZ'; did you mean Open_ES?"),
    (["train", "--algorithm", "ppo", "--pop", "8"], "--pop does not apply to ppo (it is an option of Open_ES"),
    (["train", "--algorithm", "apg", "--sigma", "0.1"], "--sigma does not apply to apg (it is an option of Open_ES"),
    (["train", "--sigma", "nan"], "sigma must be a finite number, got nan"),
    (["train", "--hidden", "0"], "hidden must be in [1, inf], got 0"),
    (["train", "--task", "tso-case6"], "unknown task 'tso-case6'"),
    (["train", "--generations", "0"], "must be positive"),
    (["eval", "/nonexistent"], "not a run directory"),
    (["config", "--algorithm", "sacc"], "did you mean sac?"),
])
def test_cli_errors_name_the_problem(args, message):
    out = _cli(*args)
    assert out.returncode == 2 and message in out.stderr


def test_the_memory_check_compiles_the_runs_own_program_once(tmp_path):
    """On a device that says how much memory it holds (here EVOGRID_DEVICE_MEMORY), the check before the run
    compiles the run's own program (`Workflow.lower_steps`) and the run loads it from the compilation cache:
    an empty cache ends the run holding one `steps` program (two where the run's program differed from the
    checked one) and no `step` program (the smaller batches' probes that named the largest fitting one)."""
    cache = tmp_path / "jax"
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "EVOGRID_DEVICE_MEMORY": "16GiB"}
    out = _cli("train", *ARGS, "--pop", "256", "--generations", "2", "--quiet", "--baselines", "oracle",
               "--out", str(tmp_path / "run"), env=env)
    assert out.returncode == 0, out.stderr
    programs = [p.name.split("-")[0] for p in cache.iterdir()]
    assert programs.count("jit_steps") == 1 and "jit_step" not in programs, sorted(programs)


def test_config_file_typos_are_named(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tso-case5", "popsize": 8}))
    out = _cli("train", "--config", str(cfg), "--out", str(tmp_path / "run"))
    assert out.returncode == 2 and "unknown config key(s) popsize; valid keys:" in out.stderr


def test_config_files_in_json_toml_and_yaml_give_the_same_config(tmp_path):
    from evogrid.cli import UsageError, _train_values

    (tmp_path / "c.json").write_text(json.dumps({"task": "tso-case5", "pop_size": 16, "hidden": [8, 8], "sigma": 0.2}))
    (tmp_path / "c.toml").write_text('task = "tso-case5"\npop_size = 16\nhidden = [8, 8]\nsigma = 0.2\n')
    (tmp_path / "c.yaml").write_text("task: tso-case5\npop_size: 16\nhidden: [8, 8]\nsigma: 0.2\n")
    configs = [_train_values(["--config", str(tmp_path / f"c.{ext}"), "--generations", "3"])[1] for ext in ("json", "toml", "yaml")]
    assert configs[0] == configs[1] == configs[2] and configs[0]["pop_size"] == 16 and tuple(configs[0]["hidden"]) == (8, 8)
    (tmp_path / "bad.toml").write_text("task = \n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(UsageError, match="cannot read --config .*bad.toml"):
        _train_values(["--config", str(tmp_path / "bad.toml")])
    with pytest.raises(UsageError, match="must hold a mapping of config keys, got list"):
        _train_values(["--config", str(tmp_path / "list.yaml")])


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tso-case5", "dso-case33bw", "dcmg", "gymnax:CartPole-v1"])
def test_rollout_command_prints_the_table(task):
    out = _cli("rollout", "--task", task, "--envs", "4", "--steps", "4")
    assert out.returncode == 0, out.stderr
    assert "throughput" in out.stdout and "episode return" in out.stdout
    assert ("cost '" in out.stdout) == (not task.startswith("gymnax"))  # gymnax tasks have no cost channels


@pytest.mark.slow
def test_rl_algorithms_train_resume_and_eval_from_the_command_line(tmp_path):
    """`evogrid train --algorithm td3` writes metrics and a curve, continues with --resume, and `eval` reads it."""
    args = ["train", "--algorithm", "td3", "--task", "tso-case5", "--envs", "4", "--hidden", "16", "--checkpoint-every", "2", "--safety", "off",
            "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "run")]
    (tmp_path / "c.json").write_text(json.dumps({"rollout_len": 12, "buffer_size": 500, "warmup_steps": 48, "updates_per_iter": 4}))
    first = _cli(*args, "--generations", "2")
    assert first.returncode == 0, first.stderr
    assert "evaluation of the chosen policy" in first.stdout and (tmp_path / "run" / "learning_curve.png").exists()
    more = _cli(*args, "--generations", "4", "--resume")
    assert more.returncode == 0 and "resumed from generation 2" in more.stderr, more.stderr
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["generation"] for r in rows] == [1, 2, 3, 4] and "critic_loss" in rows[-1]
    ev = _cli("eval", str(tmp_path / "run"))
    assert ev.returncode == 0 and "checkpoint of generation 4" in ev.stdout, ev.stderr


@pytest.mark.slow
def test_eval_against_the_oracle_alone_skips_the_operators_baselines(tmp_path):
    """`--baselines oracle` (train and eval): the gap to the oracle without the operator's myopic and MPC, which
    take minutes to hours the first time on the pglib grids; the reference's own one-step OPF stays."""
    run = tmp_path / "run"
    first = _cli("train", "--task", "tso-case5", "--pop", "4", "--episodes-per-individual", "1", "--hidden", "4",
                 "--generations", "1", "--out", str(run), "--baselines", "oracle")
    assert first.returncode == 0, first.stderr
    result = json.loads((run / "eval.json").read_text())
    assert "gap_to_oracle_pct" in result and "myopic_gap_pct" in result and "mpc_gap_pct" not in result
    assert result["baselines_layer"] == "off" and "played without the safety layer" in first.stdout
    ev = _cli("eval", str(run), "--baselines", "oracle")
    assert ev.returncode == 0 and "mpc_gap_pct" not in ev.stdout and "gap_to_oracle_pct" in ev.stdout, ev.stderr
    bad = _cli("eval", str(run), "--baselines", "none")
    assert bad.returncode == 2 and "invalid choice: 'none'" in bad.stderr


def test_config_listing_comes_from_the_config_classes():
    from evogrid.workflows import PPOConfig

    out = _cli("config", "--algorithm", "ppo")
    assert out.returncode == 0, out.stderr
    for name, _, default, help_text in PPOConfig.describe():
        line = next(r for r in out.stdout.splitlines() if r.split()[:1] == [name])
        assert help_text in line
    helped = _cli("train", "--algorithm", "ppo", "--help")
    assert "--clip-eps" in helped.stdout and "(default: 0.2)" in helped.stdout and "--pop" not in helped.stdout
    apg = _cli("config", "--algorithm", "apg")   # an ECConfig whose population options it refuses
    assert "max_grad_norm" in apg.stdout and "(not used by apg: pop_size, sigma" in apg.stdout
    assert not any(r.split()[:1] == ["pop_size"] for r in apg.stdout.splitlines())
    assert "--pop " not in _cli("train", "--algorithm", "apg", "--help").stdout


@pytest.mark.slow
def test_coevolution_from_the_command_line(tmp_path):
    """`evogrid train --task gencos-case5 --algorithm coevo` trains, resumes and evaluates."""
    args = ["train", "--task", "gencos-case5", "--algorithm", "coevo", "--pop", "4", "--episodes", "1",
            "--checkpoint-every", "1", "--out", str(tmp_path / "run")]
    assert _cli(*args, "--generations", "1").returncode == 0
    more = _cli(*args, "--generations", "2", "--resume")
    assert more.returncode == 0 and "resumed from generation 1" in more.stderr, more.stderr
    ev = _cli("eval", str(tmp_path / "run"))
    assert ev.returncode == 0 and "markup_pct" in ev.stdout and "profits:genco_4" in ev.stdout, ev.stdout + ev.stderr


@pytest.mark.slow
def test_attack_game_from_the_command_line(tmp_path):
    out = _cli("train", "--task", "tso-case14-n1", "--algorithm", "attack", "--pop", "4", "--generations", "2",
               "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert "damage_evolved_attack" in out.stdout and "attack_lines:line_0" in out.stdout


@pytest.mark.slow
def test_ctrl_c_saves_and_resume_takes_the_run_config(tmp_path, full_run):
    """SIGINT finishes the generation, writes checkpoint, CSV and PNG, prints the resume command and exits 130;
    `--resume --out RUN` alone continues with the run's own config, bit-identically to an uninterrupted run."""
    total = TOTAL  # calls of 20 generations: the signal lands long before the last one
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "evogrid.cli", "train", *ARGS, "--generations", str(total), "--out", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() or len((run / "metrics.jsonl").read_text().splitlines()) < 5:
        assert proc.poll() is None and time.time() < deadline, "run ended before it could be interrupted"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert f"evogrid train --resume --out {run} --generations {total}" in err and "Traceback" not in err
    stopped = len((run / "metrics.jsonl").read_text().splitlines())
    assert stopped < total and (run / "checkpoints" / str(stopped)).is_dir()
    assert (run / "metrics.csv").is_file() and (run / "learning_curve.png").is_file()
    refused = _cli("train", "--resume", "--out", str(run), "--generations", str(total), "--sigma", "0.2")
    assert refused.returncode == 2 and "differ from it: sigma (0.05 there, 0.2 here)" in refused.stderr
    resumed = _cli("train", "--resume", "--out", str(run), "--generations", str(total))
    assert resumed.returncode == 0, resumed.stderr
    assert metrics_rows(run / "metrics.jsonl") == metrics_rows(full_run / "metrics.jsonl")


def test_the_run_header_says_what_stands_between_the_network_and_the_grid():
    from evogrid.cli import _layer_words
    from evogrid.workflows import ECConfig, ECWorkflow

    plain = _layer_words(ECWorkflow(ECConfig(task="tso-case5", pop_size=8)))
    assert plain == "safety layer on: RedispatchLayer"
    raw = _layer_words(ECWorkflow(ECConfig(task="tso-case5", pop_size=8, safety="off", policy_output="setpoint")))
    assert raw == "safety layer off: the raw policy; the MLP outputs set-points"
    kept = _layer_words(ECWorkflow(ECConfig(task="tso-case5", pop_size=8, reach_margin=0.01, line_margin=0.025)))
    assert kept == ("safety layer on: RedispatchLayer, its look-ahead's demands widened by 1.0%, its lines' ratings "
                    "cut by 2.5%")


@pytest.mark.slow
@pytest.mark.parametrize("safety, margin", [("on", 0.0), ("off", 0.0), ("on", 0.02)])
def test_eval_compares_with_the_operators_baselines_under_the_runs_safety_setting(safety, margin):
    """The myopic and MPC rows of an evaluation are the operator's baselines played as the policy was (with
    the layer for a layered run), and the printout says so; a policy whose layer widened its look-ahead
    and kept its lines below their ratings (`reach_margin`, `line_margin`) is told apart from the baselines'
    layer, which does neither."""
    from evogrid import baselines
    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), safety=safety,
                             reach_margin=margin, line_margin=margin / 2))
    result = wf.report(wf.init())
    ops = baselines.baseline("tso-case5", operators=True)["summary"]["operators"]
    tag = "+layer" if safety == "on" else ""
    assert result["baselines_layer"] == safety == result["safety_layer"]
    assert result["myopic_gap_pct"] == ops["myopic" + tag]["gap_pct"] != ops["myopic" + ("" if tag else "+layer")]["gap_pct"]
    assert result["mpc_feasible_share"] == ops["mpc" + tag]["feasible_solved_share"]
    said = "with the safety layer, as the policy was" if safety == "on" else "without the safety layer, as the policy was"
    if margin:
        said = "with the safety layer, without the policy's reach margin and line margin"
        assert result["reach_margin"] == margin and result["units"]["reach_margin"] == "share of the forecast demand"
        assert result["line_margin"] == margin / 2 and result["units"]["line_margin"] == "share of each line's rating"
    else:
        assert "reach_margin" not in result and "line_margin" not in result
    assert said in str(result) and "gap_to_oracle_pct" in str(result)
    assert result["units"]["return"] == wf.env.units(wf.env_params)["return"]
