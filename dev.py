#!/usr/bin/env python3
"""Bootstrap evogrid on a machine that has only Python, then run something.

    python3 dev.py run     # install into .venv, run the main job (`evogrid`, no arguments)
    python3 dev.py test    # install into .venv with test extras, run the test suite
    python3 dev.py test --fast   # the same without the tests marked slow (learning, subprocesses, heavy compiles)

Extra arguments after the verb are passed on (to `evogrid` or to pytest).
Dependencies are pinned by constraints.txt; the install is skipped when
pyproject.toml and constraints.txt have not changed since the last one.
"""
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def _install(extras: str) -> None:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        digest.update((ROOT / name).read_bytes())
    digest.update(extras.encode())
    stamp = VENV / f".installed-{extras or 'base'}"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    if not PY.exists():
        print(f"[dev] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extras}]" if extras else "."
    print(f"[dev] installing evogrid{'[' + extras + ']' if extras else ''} (pinned by constraints.txt)", flush=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True, cwd=ROOT)
    subprocess.run(
        [str(PY), "-m", "pip", "install", "-q", "-c", "constraints.txt", "-e", target],
        check=True,
        cwd=ROOT,
    )
    stamp.write_text(digest.hexdigest())


def main(argv: list[str]) -> int:
    verbs = {"run": "", "test": "test"}
    if not argv or argv[0] not in verbs:
        print(__doc__.strip(), file=sys.stderr)
        print(f"\nerror: expected one of {sorted(verbs)}, got {argv[:1] or 'nothing'}", file=sys.stderr)
        return 2
    verb, rest = argv[0], argv[1:]
    _install(verbs[verb])
    if verb == "run":
        cmd = [str(PY), "-m", "evogrid.cli", *rest]
    else:
        if "--fast" in rest:
            rest = [a for a in rest if a != "--fast"] + ["-m", "not slow"]
        # one worker per core, at most 4: the tests are single-threaded for most of their time
        workers = min(4, os.cpu_count() or 1)
        parallel = ["-n", str(workers), "--dist", "worksteal"] if workers > 1 and not {"-n", "--numprocesses"} & set(rest) else []
        cmd = [str(PY), "-m", "pytest", *parallel, "--durations=15", *rest]   # the 15 slowest tests, in CI's log too
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
