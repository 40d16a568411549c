"""The files of one run directory, written in one place.

    <run>/config.json          the workflow config (the checkpoint metadata holds a copy)
    <run>/metrics.jsonl        one JSON object per generation / iteration
    <run>/metrics.csv          the same as a table (one column per scalar; vectors as one column per entry)
    <run>/tb/                  TensorBoard scalars (tensorboardX)
    <run>/learning_curve.png   return and costs over the run
    <run>/checkpoints/         orbax checkpoints (utils/checkpoint.py)

Files are replaced atomically (written to a temporary name, then renamed), so a killed run
never leaves a half-written config or CSV; a torn line of metrics.jsonl (a kill during an
append) is dropped when the history is read back, and a resume starts from the newest checkpoint
whose generations all have their rows (`complete_through`), so every generation's row is written
once. metrics.jsonl is strict JSON: a non-finite number (a validation return before the first
validation round) is written as null and read back as NaN. Nothing is written before `claim`, which
the learn loop calls only once every check of the command has passed.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
RENAMED = {"return_mean": "return"}   # metric keys of older versions -> today's (read so that their runs resume)


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
        """Refuse, before anything is written: a path under a file, an unwritable place, or a fresh run into
        a non-empty folder that is not a run. (A resume into a directory that does not exist yet starts the
        run: a preemption loop `until evogrid train --resume --out X; do :; done` may be killed before it.)"""
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"--out {self.path} is a file, not a directory")
        if not resume and self.path.is_dir() and any(self.path.iterdir()) and not is_run(self.path):
            raise FileExistsError(f"--out {self.path} is a non-empty folder that is not an evogrid run; "
                                  "choose a new or empty directory")
        parent = next((p for p in (self.path, *self.path.parents) if p.exists()), Path("."))
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise PermissionError(f"cannot write the run directory {self.path}: {parent} is not a writable directory")

    def claim(self, config: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / "config.json", json.dumps(config, indent=2))

    def _rows(self) -> dict[int, dict]:
        """generation -> its row (the last written, where one was written twice), keys of older versions
        renamed (`RENAMED`); torn lines dropped."""
        path = self.path / "metrics.jsonl"
        rows = {}
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue   # a kill during an append
            if isinstance(row, dict) and isinstance(row.get("generation"), int):
                rows[row["generation"]] = {RENAMED.get(k, k): float("nan") if v is None else v for k, v in row.items()}
        return rows

    def read_history(self, upto: int) -> list[dict]:
        """Rows with generation <= upto, in order, once each; torn (unparseable) lines are dropped."""
        rows = self._rows()
        return [rows[g] for g in sorted(rows) if g <= upto]

    def complete_through(self) -> int:
        """The largest g such that generations 1..g each have a row (0 when generation 1 has none)."""
        rows, g = self._rows(), 0
        while g + 1 in rows:
            g += 1
        return g

    def write_history(self, rows: list[dict]) -> None:
        atomic_write(self.path / "metrics.jsonl", "".join(_json_line(r) for r in rows))

    def append(self, row: dict) -> None:
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(_json_line(row))

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


def _json_line(row: dict) -> str:
    """One strict-JSON line: NaN and infinities (not JSON) written as null."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return [clean(x) for x in v] if isinstance(v, list) else v
    return json.dumps({k: clean(v) for k, v in row.items()}, allow_nan=False) + "\n"


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
