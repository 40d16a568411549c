"""Every example runs as a user would run it (small budgets) and answers --help, so none can rot."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
# the smallest budget that still runs every line of each example
SMALL = {"attack_n1.py": ["--generations", "2"], "cost_constrained_es.py": ["--generations", "2"],
         "market_coevolution.py": ["--generations", "2", "--pop", "4"], "plot_profiles.py": ["{tmp}/week.png"]}


def _run(args, tmp_path):
    return subprocess.run([sys.executable, *[a.format(tmp=tmp_path) for a in args]], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_every_example_has_a_small_budget():
    assert sorted(SMALL) == EXAMPLES


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    out = _run([f"examples/{name}", *SMALL[name]], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()
    helped = _run([f"examples/{name}", "--help"], tmp_path)
    assert helped.returncode == 0 and "usage:" in helped.stdout, helped.stderr[-2000:]
