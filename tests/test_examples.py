"""Every example runs as a user would run it (small budgets) and answers --help, and every Python block of
the README and the docs runs as written, so none can rot."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
# the smallest budget that still runs every line of each example
SMALL = {"attack_n1.py": ["--generations", "2"], "cost_constrained_es.py": ["--generations", "2"],
         "market_coevolution.py": ["--generations", "2", "--pop", "4"], "plot_profiles.py": ["{tmp}/week.png"]}


def _as_a_user_runs_it() -> dict:
    """The environment with the suite's own compiler setting taken out (conftest turns LLVM's optimiser off):
    examples and documented blocks run with the flags a user has. The suite's compile cache stays."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_backend_optimization_level")]
    return {**os.environ, "XLA_FLAGS": " ".join(flags), "PYTHONPATH": str(ROOT)}


def _run(args, tmp_path):
    return subprocess.run([sys.executable, *[a.format(tmp=tmp_path) for a in args]], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env=_as_a_user_runs_it())


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


def _python_blocks():
    """(page, index, code) of every ```python block of the README and the docs."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [(p.relative_to(ROOT).as_posix(), i, code) for p in pages
            for i, code in enumerate(re.findall(r"```python\n(.*?)```", p.read_text(), re.S))]


BLOCKS = _python_blocks()


def test_the_docs_have_python_blocks():
    assert len(BLOCKS) >= 4 and any(page == "README.md" for page, _, _ in BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("page, index, code", BLOCKS, ids=[f"{p}#{i}" for p, i, _ in BLOCKS])
def test_documented_python_runs(page, index, code, tmp_path):
    """Each block on its own, in a fresh process and an empty folder (a block writing runs/ writes there)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env=_as_a_user_runs_it())
    assert out.returncode == 0, f"{page} block {index}:\n{out.stderr[-3000:]}"


def _documented_commands():
    """(page, argv after `evogrid`) of every `evogrid` and `dev.py run` command line in a shell block of the
    README and the docs (`dev.py run ARGS` is `evogrid ARGS`)."""
    import re
    import shlex

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    out = []
    for p in pages:
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", p.read_text(), re.S):
            for line in block.splitlines():
                words = shlex.split(line, comments=True)
                at = next((i for i, w in enumerate(words) if w.endswith("evogrid") or w.endswith("dev.py")), None)
                if at is None or (words[at].endswith("dev.py") and words[at + 1:at + 2] != ["run"]):
                    continue
                rest = words[at + 1:]
                out.append((p.relative_to(ROOT).as_posix(), rest[1:] if words[at].endswith("dev.py") else rest))
    return out


COMMANDS = _documented_commands()


def test_every_documented_command_line_is_accepted(tmp_path, monkeypatch, capsys):
    """Each documented `evogrid` command parses, names a known algorithm, task and options and builds its config
    (train) or is a known command with known options; the listing commands and --help run. Running the training
    lines in full is the other tests' part (their budgets are minutes each)."""
    from evogrid import cli

    assert len(COMMANDS) >= 15 and any(page == "README.md" for page, _ in COMMANDS)
    monkeypatch.chdir(tmp_path)   # `--resume --out runs/x` reads no run of the checkout's
    for page, argv in COMMANDS:
        where = f"{page}: evogrid {' '.join(argv)}"
        if "--help" in argv or argv[:1] in (["tasks"], ["config"], ["cases"]):
            try:
                code = cli.main(argv)
            except SystemExit as stop:   # argparse's --help
                code = stop.code
            assert code == 0, where
        elif not argv or argv[0] == "train" or argv[0].startswith("-"):
            _, values = cli._train_values(argv[1:] if argv and argv[0] == "train" else argv)
            from evogrid.workflows.registry import resolve

            resolve(values["algorithm"])[1].from_dict(values)
        else:
            cli._parser().parse_args(argv)
    capsys.readouterr()
