"""Checkpoints with orbax-checkpoint: the whole run state plus the config as JSON, no pickle.

Layout: <directory>/<step>/{state, config}. A checkpoint written under a
different config is refused; a damaged newest step falls back to the newest
step that restores.
"""
from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    pass


def _pack(tree):
    """orbax cannot store zero-size arrays (e.g. the DC env's empty voltage field): store a 1-element stand-in."""
    return jax.tree_util.tree_map(lambda x: jnp.zeros((1,), x.dtype) if x.size == 0 else x, tree)


def _unpack(restored, template):
    return jax.tree_util.tree_map(lambda r, t: t if t.size == 0 else r, restored, template)


@contextlib.contextmanager
def _quiet_orbax():
    loggers = [logging.getLogger(name) for name in ("absl", "orbax", "orbax.checkpoint", "tensorstore")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class Checkpointer:
    def __init__(self, directory: str | Path, config: dict, max_to_keep: int = 3, defaults: dict | None = None):
        """`config`: the run's, saved with each checkpoint and compared on restore; `defaults`: the config
        class's (`Config.defaults()`): a key a checkpoint lacks (written before the field existed) counts as
        its default."""
        self.directory = Path(directory).absolute()
        self.config = json.loads(json.dumps(config))  # canonical JSON types for comparison
        self.defaults = json.loads(json.dumps(defaults or {}))
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
        with _quiet_orbax():
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "config"))

    def save(self, step: int, state) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_pack(state)),
                                                        config=ocp.args.JsonSave(self.config)), force=True)
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        with _quiet_orbax():
            self.manager.reload()
        return sorted(self.manager.all_steps())

    def restore_latest(self, template, log=None, upto: int | None = None):
        """(step, state) from the newest restorable checkpoint (of step <= `upto`, when given), or None when
        there is none.

        Newer steps that fail to restore (a damaged or partial write) are removed, and `log`
        (if given) is told in one line which step was damaged and which one is used. Steps past `upto`
        (ahead of the run's complete metrics rows) are removed too, and said.

        Raises CheckpointError when the checkpoints were written under another config,
        or when steps exist but none of them restores.
        """
        steps = self.steps()
        ahead = [s for s in steps if upto is not None and s > upto]
        if ahead:
            for s in ahead:
                self.manager.delete(s)
            if log is not None:
                log(f"checkpoint step(s) {', '.join(map(str, ahead))} ahead of the metrics rows (complete through "
                    f"{upto}) removed")
            steps = [s for s in steps if s <= upto]
        if not steps:
            return None
        with _quiet_orbax():  # a damaged step is reported once, by `log`, not by orbax's own error logs
            return self._restore_newest(steps, template, log)

    def _restore_newest(self, steps, template, log):
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _pack(template))
        errors = []
        for step in reversed(steps):
            try:
                saved_config = self.manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
            except Exception as err:  # a damaged step: try the one before
                errors.append(f"step {step}: {type(err).__name__}: {err}")
                continue
            absent = object()
            diff = sorted(k for k in set(saved_config) | set(self.config)
                          if saved_config.get(k, self.defaults.get(k, absent)) != self.config.get(k, absent))
            if diff:
                raise CheckpointError(
                    f"checkpoint in {self.directory} was written with a different config (differs in: "
                    f"{', '.join(diff)}); resume with the same options, or use a new output directory"
                )
            try:
                state = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
                state = _unpack(state, template)
            except Exception as err:
                errors.append(f"step {step}: {type(err).__name__}: {err}")
                continue
            damaged = [s for s in steps if s > step]
            for s in damaged:  # unreadable newer steps would block re-saving them
                self.manager.delete(s)
            if damaged and log is not None:
                log(f"checkpoint step(s) {', '.join(map(str, damaged))} damaged (removed); resuming from step {step}")
            return step, state
        raise CheckpointError(f"no checkpoint in {self.directory} could be restored:\n  " + "\n  ".join(errors))
