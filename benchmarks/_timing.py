"""Shared timing for the benchmark scripts (imported by path: the scripts run from this folder)."""
from __future__ import annotations

import time

import jax


def time_steps(wf, repeats: int) -> tuple[float, float]:
    """(best seconds of one `wf.step` over `repeats` calls, seconds of the first call: compile + run)."""
    state = wf.init()
    t0 = time.perf_counter()
    state, _ = wf.step(state)
    jax.block_until_ready(state)
    compile_s, best = time.perf_counter() - t0, float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, _ = wf.step(state)
        jax.block_until_ready(state)
        best = min(best, time.perf_counter() - t0)
    return best, compile_s
