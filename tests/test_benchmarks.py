"""Benchmark scripts run on any machine at small sizes (their own smoke tests)."""
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


@pytest.mark.slow
def test_n1_screening_benchmark_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "n1_screening.py"), "--quick"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "case118, 32 states, 177 non-bridge outages x 186 branches" in out.stdout
    assert "| pandapower rundcpp loop" in out.stdout and "| tso-case118-n1   |" in out.stdout
