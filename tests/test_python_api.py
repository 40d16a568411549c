"""What a Python user gets without the CLI: the compile cache, `evogrid.load` of a run, `Workflow.report`."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import evogrid

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), safety="off")

CACHE = textwrap.dedent("""
    import jax
    from evogrid.workflows import ECConfig, ECWorkflow
    ECWorkflow(ECConfig(task="tso-case5", pop_size=4, episodes_per_individual=1, hidden=(4,), safety="off"))
    print(jax.config.jax_compilation_cache_dir)
""")


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["1", "0"])
def test_building_a_workflow_keeps_compiled_programs_unless_switched_off(tmp_path, switch):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    env.update(XDG_CACHE_HOME=str(tmp_path), EVOGRID_COMPILE_CACHE=switch)
    out = subprocess.run([sys.executable, "-c", CACHE], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    want = str(tmp_path / "evogrid" / "jax") if switch == "1" else "None"
    assert out.stdout.strip().splitlines()[-1] == want


@pytest.mark.slow
def test_load_returns_the_runs_workflow_and_its_checkpointed_state(tmp_path):
    import jax
    import numpy as np

    from evogrid.workflows import ECConfig, ECWorkflow

    wf = ECWorkflow(ECConfig(**SMALL))
    state, _ = wf.learn(wf.init(), 2, run_dir=tmp_path / "run", checkpoint_every=1, progress=False)
    loaded, restored, step = evogrid.load(tmp_path / "run")
    assert step == 2 and loaded.config == wf.config
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        evogrid.load(tmp_path)
