"""Benchmark scripts run on any machine at small sizes (their own smoke tests)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from evogrid.physics import ac as ph_ac

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_accelerator_benchmark_smoke_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "accelerator.py"), "--smoke", "--repeats", "1",
                          "--tasks", "tso-case5", "--parts", "envs,agree,audit,train,fits,blocks,profile", "--top", "3"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "EVOGRID_DEVICE_MEMORY": "2GiB"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("# CPU")
    assert "| tso-case5 | on | 16 | " in out.stdout and "| tso-case5 | off | 16 | " in out.stdout
    # on the CPU the "device" is the host: the agreement column reads exactly zero, with no flips
    assert "| tso-case5 | on | 0.0e+00 | 0 / 12 | - |" in out.stdout
    # the audit lists the DC flows' products with the line of evogrid's source that made them
    assert re.search(r"\| dot \| highest,highest \| envs/trans.py:\d+ ", out.stdout), out.stdout
    # the profile: the rollout's three largest ops, their shares of the device's time summing to at most 100%
    block = out.stdout.split("tso-case5, layer off, 16 envs (")[1].split("\n\n")[0]
    shares = [float(x) for x in re.findall(r"^\| [\w.-]+ \| ([\d.]+)% \|", block, re.M)]
    assert len(shares) == 3 and 0 < sum(shares) <= 100.0 and shares == sorted(shares, reverse=True), block
    assert "| tso-case5 | 16 | " in out.stdout and "peak host memory:" in out.stdout   # the train loop's row
    assert "| tso-case5 | scan_rollout, every output | 16 | " in out.stdout   # the blocks part's rows
    assert "| tso-case5 | make_random_rollout | 16 | " in out.stdout
    # the largest population and env batch in 2 GiB: the population's need per member times it fills what fits
    row = re.search(r"\| tso-case5 \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|", out.stdout)
    pop, per_1000, envs = (int(g.replace(",", "")) for g in row.groups())
    assert 0 < pop * per_1000 / 1000 <= 2048 and pop % 2 == 0 and envs > 0


@pytest.mark.slow
def test_ac_solver_benchmark_smoke_runs_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ac_solver.py"), "--smoke", "--repeats", "1",
                          "--tasks", "tso-case14-ac", "--variants", "mr:8,bad"], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode != 0 and "variant 'bad': write gmres:K or mr:K" in out.stderr, out.stderr[-2000:]
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ac_solver.py"), "--smoke", "--repeats", "1",
                          "--tasks", "tso-case14-ac", "--variants", "mr:8"], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exact vs chip-rounded products (CPU stand-in)" in out.stdout
    rows = {m[0]: m[1:] for m in re.findall(r"^\| tso-case14-ac \| (\w+:\d+) \| 16 \| [\d,]+ \| ([\d.]+) \| [\d.]+ "
                                             r"\| (\d+) / 192 \| ([\d.e+-]+) \| (\d+) / \d+ \|$", out.stdout, re.M)}
    assert set(rows) == {f"gmres:{ph_ac.Q_SWEEPS}", "mr:8"}, out.stdout   # the library's own first, at ratio 1
    assert rows[f"gmres:{ph_ac.Q_SWEEPS}"][0] == "1.00"
    for _, miss, rel, flips in rows.values():   # every step solved, the chip's rounding moves no return by 1e-4
        assert miss == "0" and float(rel) < 1e-4 and flips == "0", out.stdout


@pytest.mark.slow
def test_n1_screening_benchmark_quick_runs():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "n1_screening.py"), "--quick"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "case118, 32 states, 177 non-bridge outages x 186 branches" in out.stdout
    assert "| pandapower rundcpp loop" in out.stdout and "| tso-case118-n1   |" in out.stdout
