"""The files of one run directory, written in one place.

    <run>/config.json          the workflow config (the checkpoint metadata holds a copy)
    <run>/metrics.jsonl        one JSON object per generation / iteration
    <run>/metrics.csv          the same as a table (one column per scalar; vectors as one column per entry)
    <run>/tb/                  TensorBoard scalars (tensorboardX)
    <run>/learning_curve.png   return and costs over the run
    <run>/checkpoints/         orbax checkpoints (utils/checkpoint.py)

Files are replaced atomically (written to a temporary name, then renamed), so a killed run
never leaves a half-written config or CSV; a torn last line of metrics.jsonl (a kill during an
append) is dropped when the history is read back. Nothing is written before `claim`, which
the learn loop calls only once every check of the command has passed.
"""
from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")


def atomic_write(path: Path, text: str | bytes) -> None:
    """Replace `path` by `text` (or bytes) at once: a reader (another process too) sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")   # one per writer: two processes may write one cache
    tmp.write_bytes(text) if isinstance(text, bytes) else tmp.write_text(text)
    os.replace(tmp, path)


def is_run(path: Path) -> bool:
    return any((path / marker).exists() for marker in RUN_MARKERS)


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def check_writable(self, resume: bool) -> None:
        """Refuse, before anything is written: a path under a file, an unwritable place, resuming a
        directory that does not exist, or a fresh run into a non-empty folder that is not a run."""
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"--out {self.path} is a file, not a directory")
        if resume and not self.path.is_dir():
            raise FileNotFoundError(f"cannot resume: {self.path} does not exist (check --out)")
        if not resume and self.path.is_dir() and any(self.path.iterdir()) and not is_run(self.path):
            raise FileExistsError(f"--out {self.path} is a non-empty folder that is not an evogrid run; "
                                  "choose a new or empty directory")
        parent = next((p for p in (self.path, *self.path.parents) if p.exists()), Path("."))
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise PermissionError(f"cannot write the run directory {self.path}: {parent} is not a writable directory")

    def claim(self, config: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / "config.json", json.dumps(config, indent=2))

    def read_history(self, upto: int) -> list[dict]:
        """Rows with generation <= upto; a torn (unparseable) last line is dropped."""
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        rows = []
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # a kill during the last append
                raise ValueError(f"{path}: line {i + 1} is not JSON; the metrics file is damaged") from None
        return [r for r in rows if r.get("generation", 0) <= upto]

    def write_history(self, rows: list[dict]) -> None:
        atomic_write(self.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def write_csv(self, rows: list[dict]) -> None:
        """One column per scalar; a vector `name` becomes columns name[0], name[1], ... (or the given names)."""
        if not rows:
            return
        header, flat_rows = None, []
        for row in rows:
            flat = flatten_row(row)
            header = header or list(flat)
            flat_rows.append([flat.get(k, "") for k in header])
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(header)
        w.writerows(flat_rows)
        atomic_write(self.path / "metrics.csv", out.getvalue())


def flatten_row(row: dict, names: dict | None = None) -> dict:
    """Scalars as they are; a list under key k as k[i] (or k:name with `names[k]` = entry names)."""
    flat = {}
    for k, v in row.items():
        if isinstance(v, list):
            labels = (names or {}).get(k) or [str(i) for i in range(len(v))]
            for label, x in zip(labels, v):
                flat[f"{k}:{label}"] = x
        else:
            flat[k] = v
    return flat
