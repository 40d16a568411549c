"""The accelerator benchmark script runs on any machine at small sizes (its own smoke test)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_benchmark_smoke_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--repeats", "1"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| tso-case14 DC envs N | env-steps/s |" in out.stdout and "| 256 | " in out.stdout
    assert "| ECWorkflow Open_ES population |" in out.stdout and out.stdout.startswith("# ")
