"""The `Workflow` base: `init(key)`, jitted `step(state)` / `evaluate(state)`, and the Python `learn` loop.

`learn` is the only Python in a run: it calls the compiled `step` once per
generation, appends the metrics to `<run_dir>/metrics.jsonl` (and CSV, and
TensorBoard event files under `<run_dir>/tb` when tensorboardX is installed), prints
progress with an ETA, and checkpoints the whole state every
`checkpoint_every` generations and at the end. With `resume=True` it continues
from the newest checkpoint, bit-identically to an uninterrupted run: the state
carries the PRNG key, and the metrics file is cut back to the restored
generation before new lines are appended. With several processes
(`jax.distributed`), every process runs the loop and takes part in checkpointing
(orbax coordinates the write); only process 0 writes metrics files and progress.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

from evogrid.utils.checkpoint import Checkpointer
from evogrid.utils.jax_utils import jit_method


class ConfigMixin:
    """Shared by the frozen config dataclasses: dict round trip (config files, checkpoint metadata)."""

    @classmethod
    def from_dict(cls, values: dict):
        """Build from a dict (a --config file, a checkpoint's config.json), naming unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def _check(self, algorithms, kind: str):
        """Normalise `hidden` to a tuple of ints and refuse an unknown algorithm."""
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if self.algorithm not in algorithms:
            raise ValueError(f"unknown {kind}algorithm {self.algorithm!r}; choose one of {', '.join(algorithms)}")


class Workflow:
    """Subclasses implement `init(key)`, `_step(state)`, `_evaluate(state)` and `config_dict()`."""

    def init(self, key) -> object:
        raise NotImplementedError

    @jit_method()
    def step(self, state):
        """One generation / iteration as one compiled call: -> (state, metrics)."""
        return self._step(state)

    @jit_method()
    def evaluate(self, state):
        return self._evaluate(state)

    def config_dict(self) -> dict:
        raise NotImplementedError

    def learn(self, state, generations: int, run_dir: str | Path | None = None, checkpoint_every: int = 10,
              resume: bool = False, progress: bool = True):
        """Run until `generations` steps have been taken in total. Returns (state, history)."""
        history: list[dict] = []
        ckpt = start = None
        primary = jax.process_index() == 0
        progress = progress and primary
        if run_dir is not None:
            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            if primary:
                (run_dir / "config.json").write_text(json.dumps(self.config_dict(), indent=2))
            ckpt = Checkpointer(run_dir / "checkpoints", self.config_dict())
            restored = ckpt.restore_latest(state) if resume else None
            if resume and restored is None and progress:
                print(f"[evogrid] no checkpoint in {run_dir}; starting from scratch", file=sys.stderr)
            if restored is not None:
                start, state = restored
                history = _read_history(run_dir / "metrics.jsonl", start)
                if progress:
                    print(f"[evogrid] resumed from generation {start} in {run_dir}", file=sys.stderr)
            elif not resume and ckpt.steps():
                raise FileExistsError(f"{run_dir} already holds checkpoints; pass resume=True (--resume) or use a new directory")
            if primary:
                _write_history(run_dir, history)
        start = start or 0
        files = run_dir is not None and primary
        tb = _tensorboard(run_dir, start) if files else None
        t0 = time.perf_counter()
        for gen in range(start, generations):
            state, metrics = self.step(state)
            row = {"generation": gen + 1, **_to_python(metrics)}
            history.append(row)
            if files:
                with open(run_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
            if tb is not None:
                for k, v in row.items():
                    if isinstance(v, (int, float)) and k != "generation":
                        tb.add_scalar(k, v, gen + 1)
            done = gen + 1
            if ckpt is not None and (done % checkpoint_every == 0 or done == generations):
                ckpt.save(done, state)
            if progress:
                _progress(done, generations, start, t0, row)
        if progress and generations > start and sys.stderr.isatty():
            print(file=sys.stderr)
        if files:
            _write_csv(run_dir / "metrics.csv", history)
        if tb is not None:
            tb.close()
        return state, history


def _tensorboard(run_dir: Path, start: int):
    """A tensorboardX writer (None when it is not installed); on resume, events after `start` are purged."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tb"), purge_step=start + 1 if start else None, flush_secs=10)


def _to_python(metrics) -> dict:
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.item() if v.ndim == 0 else v.tolist()
    return out


def _read_history(path: Path, upto: int) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["generation"] <= upto]


def _write_history(run_dir: Path, history: list[dict]) -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))


def _write_csv(path: Path, history: list[dict]) -> None:
    if not history:
        return
    keys = list(history[0])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for row in history:
            w.writerow([json.dumps(row[k]) if isinstance(row[k], list) else row[k] for k in keys])


def _progress(done: int, total: int, start: int, t0: float, row: dict) -> None:
    """A one-line bar redrawn in place on a terminal; in a log, a line every 5% of the run."""
    tty = sys.stderr.isatty()
    if not tty and done != total and done % max(1, total // 20):
        return
    frac = done / total
    rate = (time.perf_counter() - t0) / max(done - start, 1)
    eta = rate * (total - done)
    bar = "#" * int(24 * frac) + "-" * (24 - int(24 * frac))
    shown = "  ".join(f"{k} {row[k]:.4g}" for k in ("fitness_max", "fitness_mean", "cost_mean", "return", "episode_cost")
                      if k in row)
    line = f"[{bar}] gen {done}/{total}  {shown}  {rate:.3f}s/gen  ETA {eta:.0f}s"
    print("\r" + line if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
