"""Population sharding: the same seed gives bit-identical fitness and parameters on 1 device, 2 devices
(forced host devices) and 2 processes (jax.distributed on 127.0.0.1, gloo collectives); a checkpoint
written by the two-process run restores in a single process."""
import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import metrics_rows

from evogrid.utils.checkpoint import Checkpointer
from evogrid.utils.sharding import check_divisible
from evogrid.workflows import ECConfig, ECWorkflow

ROOT = Path(__file__).resolve().parents[1]
# pop 8 in blocks of 4: each device (of 1 or 2) evaluates 4-individual blocks, so every run compiles the same block
RUN = ["train", "--task", "tso-case5", "--pop", "8", "--episodes", "1", "--generations", "3", "--checkpoint-every", "3",
       "--safety", "off"]   # the layer works per individual: these runs are about the population's sharding
CONFIG = {"eval_block": 4}


def _env(devices=1):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return env


def _train(out: Path, devices=1, extra=()):
    cfg = out.parent / f"{out.name}.json"
    cfg.write_text(json.dumps(CONFIG))
    return subprocess.Popen([sys.executable, "-m", "evogrid.cli", *RUN, "--config", str(cfg), "--out", str(out), *extra],
                            env=_env(devices), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return out


def _restore(run: Path):
    config = ECConfig.from_dict(json.loads((run / "config.json").read_text()))
    return Checkpointer(run / "checkpoints", config.to_dict()).restore_latest(ECWorkflow(config).init())


def _assert_same_run(a: Path, b: Path):
    assert metrics_rows(a / "metrics.jsonl") == metrics_rows(b / "metrics.jsonl")  # fitness, returns, costs
    (step_a, state_a), (step_b, state_b) = _restore(a), _restore(b)
    assert step_a == step_b == 3
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(state_a), jax.tree_util.tree_leaves(state_b)):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    stdout = _finish(_train(out))
    assert "on 1 CPU device(s)" in stdout
    return out


@pytest.mark.slow   # subprocesses
def test_two_devices_match_one_device_bit_for_bit(single, tmp_path):
    out = tmp_path / "two"
    stdout = _finish(_train(out, devices=2))
    assert "on 2 CPU device(s)" in stdout
    _assert_same_run(single, out)


@pytest.mark.slow   # subprocesses
def test_two_processes_match_one_process_and_restore_in_one(single, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "multi"
    procs = [_train(out, extra=("--distributed", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                "--process-id", str(i))) for i in range(2)]
    stdout = [_finish(p) for p in procs]
    assert "on 2 CPU device(s) in 2 processes" in stdout[0] and "metrics:" in stdout[0]
    assert "evogrid train" not in stdout[1] and "metrics:" not in stdout[1]  # only process 0 reports and writes files
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    _assert_same_run(single, out)  # _restore runs here, in this single-device process


def test_population_must_split_evenly_over_devices():
    two = types.SimpleNamespace(devices=np.empty(2))
    check_divisible(8, two)
    with pytest.raises(ValueError, match="pop_size 7 cannot be split evenly over the 2 devices.*multiple of 2"):
        check_divisible(7, two)
    with pytest.raises(ValueError, match="eval_block must be 0 or divide pop_size 8"):
        ECConfig(task="tso-case5", pop_size=8, eval_block=3)


@pytest.mark.slow   # subprocesses
def test_distributed_needs_an_output_directory():
    out = subprocess.run([sys.executable, "-m", "evogrid.cli", "train", "--distributed", "--coordinator", "127.0.0.1:1",
                          "--num-processes", "1", "--process-id", "0", "--generations", "1"],
                         env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--distributed needs --out" in out.stderr


APG_RUN = """
import json, jax, numpy as np
from evogrid.envs import make
from evogrid.workflows import APGConfig, APGWorkflow
env, params = make("tso-case5", max_steps=8, n_days=12)
wf = APGWorkflow(APGConfig(task="tso-case5", hidden=(8,), episodes_per_individual=4, select_every=1, safety="off"),
                 env, params)   # the layer only adds compile time to what is tested here
state = wf.init(jax.random.key(0))
rows = []
for _ in range(3):
    state, m = wf.step(state)
    rows.append([float(m["return"]), float(m["grad_norm"]), float(m["val_return"])])
print(json.dumps({"devices": len(jax.devices()), "rows": rows, "params": np.asarray(state.es_state["params"]).tolist()}))
"""


@pytest.mark.slow   # subprocesses
def test_apg_splits_its_days_over_two_devices():
    """Each device plays half of a step's days; the gradient is summed over both: the same steps as on one
    device up to that sum's rounding (a missing sum would halve the gradient)."""
    runs = []
    for devices in (1, 2):
        out = subprocess.run([sys.executable, "-c", APG_RUN], env=_env(devices), cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert [r["devices"] for r in runs] == [1, 2]
    np.testing.assert_allclose(runs[1]["rows"], runs[0]["rows"], rtol=1e-5)
    np.testing.assert_allclose(runs[1]["params"], runs[0]["params"], rtol=1e-4, atol=1e-7)


def test_apg_days_must_split_evenly_over_devices():
    from evogrid.envs import make
    from evogrid.workflows import APGConfig, APGWorkflow

    env, params = make("tso-case5", max_steps=4, n_days=4)
    two = types.SimpleNamespace(devices=np.empty(2))
    with pytest.raises(ValueError, match="each step's 3 days cannot be split evenly over the 2 devices"):
        APGWorkflow(APGConfig(task="tso-case5", episodes_per_individual=3), env, params, mesh=two)
    three = types.SimpleNamespace(devices=np.empty(3))   # the population's size (64 by default) is not APG's concern
    APGWorkflow(APGConfig(task="tso-case5", episodes_per_individual=3), env, params, mesh=three)
