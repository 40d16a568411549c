"""`evogrid bench`: names checked before anything runs, a killed grid resumes skipping finished runs, a failing
run is recorded and the grid goes on; the summary's interval is a bootstrap over seeds."""
import json

import numpy as np
import pytest

from evogrid import bench, cli


def test_unknown_names_are_refused_before_any_run(tmp_path, capsys):
    code = cli.main(["bench", "--algorithms", "Open_ES,openez", "--tasks", "tso-case5", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown algorithm(s) openez; choose from Open_ES" in err
    code = cli.main(["bench", "--algorithms", "ppo", "--tasks", "tso-case6", "--out", str(tmp_path / "b")])
    assert code == 2 and "unknown task(s) tso-case6; choose from" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
    # every name the task registry parses is accepted (forecast suffixes included), and nothing else
    assert bench.check_grid(["ppo"], ["tso-case5-fc4", "dso-case33bw-real-fc4"])[1] == ["tso-case5-fc4", "dso-case33bw-real-fc4"]
    with pytest.raises(ValueError, match=r"unknown task\(s\) tso-case5-fc, tso-case5-n2; choose from .*'-fc<H>'"):
        bench.check_grid(["ppo"], ["tso-case5", "tso-case5-fc", "tso-case5-n2"])
    # an empty grid or no budget is refused too, before anything runs
    with pytest.raises(ValueError, match="at least one algorithm and one task"):
        bench.check_grid([], ["tso-case5"])
    for seeds, generations in ((0, None), (1, 0), (1, -1)):
        with pytest.raises(ValueError, match="seeds and generations must be at least 1"):
            bench.check_grid(["ppo"], ["tso-case5"], seeds, generations)
    with pytest.raises(ValueError, match="layers must be on, off or both"):
        bench.check_grid(["ppo"], ["tso-case5"], layers=["maybe"])
    # an entry may carry config overrides: checked against the algorithm's config, kept as its label
    assert bench.check_grid(["sep-cma-es:init=operator:sigma=0.02"], ["tso-case5"])[0] == ["Sep_CMA_ES:init=operator:sigma=0.02"]
    assert bench.parse_algorithm("Sep_CMA_ES:init=operator:sigma=0.02") == ("Sep_CMA_ES", {"init": "operator", "sigma": 0.02})
    with pytest.raises(ValueError, match="Open_ES:init=mpc: init must be one of random, operator"):
        bench.check_grid(["Open_ES:init=mpc"], ["tso-case5"])
    with pytest.raises(ValueError, match="overrides follow the algorithm as :key=value"):
        bench.check_grid(["Open_ES:init"], ["tso-case5"])


@pytest.mark.slow
def test_bench_resumes_and_records_failures(tmp_path, monkeypatch):
    out, logs = tmp_path / "b", []
    bench.bench(["Open_ES"], ["tso-case5"], 1, out, generations=1, log=logs.append)   # the layer on and off
    # a second call with one more seed and a failing cell (coevo has no safety layer: off only): only the new runs
    rows = bench.bench(["Open_ES", "coevo"], ["tso-case5"], 2, out, generations=1, log=logs.append)
    assert any("2 runs done, 4 to go" in m for m in logs) and logs[-1].startswith("evogrid bench: 4 runs in ")
    by = {(r["algorithm"], r["layer"], r["seed"]): r for r in rows}
    assert len(rows) == 6 and all(by[("Open_ES", layer, s)]["status"] == "ok" for layer in ("on", "off") for s in (0, 1))
    assert by[("coevo", "off", 0)]["status"] == "failed" and "co-evolution needs a market task" in by[("coevo", "off", 0)]["error"]
    on, off = by[("Open_ES", "on", 1)], by[("Open_ES", "off", 1)]
    assert np.isfinite(on["gap_pct"]) and 0.0 <= on["feasible_share"] <= 1.0 and on["gap_worst_pct"] >= on["gap_p95_pct"]
    # the oracle solves all 16 of tso-case5's test days, so both feasibility shares count the same days
    assert on["gap_days"] == 16 and on["feasible_solved_share"] == on["feasible_share"]
    # with the layer: the raw policy's feasible days and the MWh the layer moved; without: neither
    assert 0.0 <= on["raw_feasible_solved_share"] <= 1.0 and on["moved_mwh"] >= 0.0 and on["decision_s"] > 0.0
    assert "moved_mwh" not in off and "raw_feasible_solved_share" not in off
    table = (out / "results.md").read_text()
    assert "**tso-case5**" in table and "| Open_ES | on |" in table and "| Open_ES | off |" in table
    assert "| baseline:mpc | on |" in table and "| baseline:zero | off |" in table and (out / "results.png").stat().st_size > 1000
    lines = (out / "results.jsonl").read_text().splitlines()
    # the first call's runs, then the second's in grid order (algorithm, task, layer, seed)
    assert [(json.loads(x)["algorithm"], json.loads(x)["layer"], json.loads(x)["seed"]) for x in lines] == [
        ("Open_ES", "on", 0), ("Open_ES", "off", 0), ("Open_ES", "on", 1), ("Open_ES", "off", 1),
        ("coevo", "off", 0), ("coevo", "off", 1)]
    # a stop request (Ctrl-C / SIGTERM) during a run: the bench stops and the cut-short run is not recorded
    import contextlib

    from evogrid.workflows import base

    monkeypatch.setattr(base, "_stop_requests", lambda: contextlib.nullcontext(lambda: True))
    with pytest.raises(KeyboardInterrupt, match="stopped during Open_ES on tso-case5 seed 2"):
        bench.bench(["Open_ES"], ["tso-case5"], 3, out, generations=2, log=logs.append)
    assert len((out / "results.jsonl").read_text().splitlines()) == 6


def test_bootstrap_interval_brackets_the_mean():
    mean, lo, hi = bench.bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and lo < mean < hi and 1.0 <= lo and hi <= 4.0
    assert np.isnan(bench.bootstrap_ci([])[0])
