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


@pytest.mark.slow
def test_bench_resumes_and_records_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out, logs = tmp_path / "b", []
    bench.bench(["Open_ES"], ["tso-case5"], 1, out, generations=2, log=logs.append)
    # a second call with one more seed and a failing cell: only the new runs happen
    rows = bench.bench(["Open_ES", "coevo"], ["tso-case5"], 2, out, generations=2, log=logs.append)
    assert any("1 runs done, 3 to go" in m for m in logs) and logs[-1].startswith("evogrid bench: 3 runs in ")
    by = {(r["algorithm"], r["seed"]): r for r in rows}
    assert len(rows) == 4 and by[("Open_ES", 0)]["status"] == by[("Open_ES", 1)]["status"] == "ok"
    assert by[("coevo", 0)]["status"] == "failed" and "co-evolution needs a market task" in by[("coevo", 0)]["error"]
    assert np.isfinite(by[("Open_ES", 1)]["gap_pct"]) and 0.0 <= by[("Open_ES", 1)]["feasible_share"] <= 1.0
    # the oracle solves all 16 of tso-case5's test days, so both feasibility shares count the same days
    assert by[("Open_ES", 1)]["gap_days"] == 16
    assert by[("Open_ES", 1)]["feasible_solved_share"] == by[("Open_ES", 1)]["feasible_share"]
    table = (out / "results.md").read_text()
    assert "| tso-case5 | Open_ES |" in table and "oracle solves |" in table and (out / "results.png").stat().st_size > 1000
    lines = (out / "results.jsonl").read_text().splitlines()
    # the first call's run, then the second's in grid order (algorithm, task, seed)
    assert [(json.loads(x)["algorithm"], json.loads(x)["seed"]) for x in lines] == [
        ("Open_ES", 0), ("Open_ES", 1), ("coevo", 0), ("coevo", 1)]
    # a stop request (Ctrl-C / SIGTERM) during a run: the bench stops and the cut-short run is not recorded
    import contextlib

    from evogrid.workflows import base

    monkeypatch.setattr(base, "_stop_requests", lambda: contextlib.nullcontext(lambda: True))
    with pytest.raises(KeyboardInterrupt, match="stopped during Open_ES on tso-case5 seed 2"):
        bench.bench(["Open_ES"], ["tso-case5"], 3, out, generations=2, log=logs.append)
    assert len((out / "results.jsonl").read_text().splitlines()) == 4


def test_bootstrap_interval_brackets_the_mean():
    mean, lo, hi = bench.bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and lo < mean < hi and 1.0 <= lo and hi <= 4.0
    assert np.isnan(bench.bootstrap_ci([])[0])
