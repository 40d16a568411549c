"""JAX helpers: the EvoRL-style jit boundary (`jit_method`, `rng_split`, `tree_stop_gradient`) and tree utilities.

The PowerZooJax batch helpers `split_key_for_envs`, `batch_reset`, `batch_step` and
`scan_rollout` live in `evogrid.rollout` (the one rollout path) and are importable from here
too, with the signatures and return tuples of the PowerZooJax parallelization contract.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.rollout import batch_reset, batch_step, reset_key, scan_rollout, split_key_for_envs  # noqa: F401  (one way: rollout imports nothing from here)


def jit_method(*, static_argnums=(0,), static_argnames=None, donate_argnums=()):
    """Decorate a method with `jax.jit`, treating `self` (argument 0) as static.

    `self` is hashed by identity, so configuration stored on the instance is a
    compile-time constant: build the object once and reuse it, or each new
    instance compiles again. Apply at class definition, never by patching.
    """
    if 0 not in tuple(static_argnums):
        static_argnums = (0, *static_argnums)

    def decorator(fn):
        return functools.wraps(fn)(
            jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames, donate_argnums=donate_argnums)
        )

    return decorator


def rng_split(key: jax.Array, num: int = 2) -> jax.Array:
    """Split a PRNG key (new-style `jax.random.key` or legacy `PRNGKey`) into `num` keys."""
    return jax.random.split(key, num)


def uniform_index(key: jax.Array, n: int) -> jax.Array:
    """An int32 index in [0, n) read from the key's own bits.

    A key produced by `jax.random.split` is itself threefry output, i.e. uniform
    random bits, so reading them costs nothing where `jax.random.randint` would
    run the hash twice more (on CPU each run is a rolled loop; in a per-step
    auto-reset that doubled the step time). Modulo bias is below n / 2**32.
    Use a fresh split key (or its `reset_key`), never one whose bits were already used this way.
    """
    bits = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return (bits.reshape(-1)[-1] % jnp.uint32(n)).astype(jnp.int32)


def tree_stop_gradient(tree):
    return jax.tree_util.tree_map(jax.lax.stop_gradient, tree)


def stop_obs_state_gradient(transition):
    """Apply `stop_gradient` to the obs and state of a `step` result tuple (what `step_auto_reset` adds)."""
    obs, state, *rest = transition
    return (jax.lax.stop_gradient(obs), tree_stop_gradient(state), *rest)


def strong_types(tree, like=None):
    """Every leaf as an array of a fixed (not weak) dtype: `like`'s dtypes when given, else its own.
    evosax states hold weak-typed scalars; a jitted step fed them would retrace at its second call."""
    if like is None:
        return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), tree)
    return jax.tree_util.tree_map(lambda new, old: jnp.asarray(new, dtype=old.dtype), tree, like)


def tree_where(cond, on_true, on_false):
    """Leaf-wise `jnp.where(cond, a, b)` over two pytrees of the same structure (cond is a scalar)."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(cond, a, b), on_true, on_false)


def small_solve(a, b, pivot: bool = True):
    """x = a^-1 b for a small square `a` [n, n] (static n), `b` [n] or [n, k]: Gaussian elimination and back
    substitution unrolled into rank-one updates, with selects rather than scatters or gathers, so that it
    vectorises across a vmapped batch. A batched LAPACK call does not, and on the CPU jaxlib's batched LU and
    Cholesky deadlock once two of them are in flight on a pool of two threads (jax 0.10.2: gencos-case14 hung
    at 192 envs and more on 2 cores). `pivot`: partial pivoting (each column's largest remaining entry is
    swapped up; ties to the lower row); without it, for a symmetric positive definite `a` (as stable as
    Cholesky there, also on the ill-conditioned normal equations of an interior point). A singular `a` gives
    inf or NaN."""
    n, vec = a.shape[0], b.ndim == 1
    m, pos = jnp.concatenate([a, b[:, None] if vec else b], axis=1), jnp.arange(n)[:, None]
    for i in range(n - 1):
        if pivot:
            p = jnp.argmax(jnp.where(pos[:, 0] >= i, jnp.abs(m[:, i]), -1.0))
            mine, theirs = m[i], jnp.sum(jnp.where(pos == p, m, 0.0), axis=0)   # row p picked by a select
            m = jnp.where(pos == i, theirs[None, :], jnp.where(pos == p, mine[None, :], m))
        m = m - jnp.outer(jnp.where(pos[:, 0] > i, m[:, i] / m[i, i], 0.0), m[i])
    x = jnp.zeros_like(m[:, n:])
    for i in range(n - 1, -1, -1):
        x = jnp.where(pos == i, ((m[i, n:] - m[i, :n] @ x) / m[i, i])[None, :], x)
    return x[:, 0] if vec else x


def largest(x, k: int):
    """(values, indices) of the `k` largest entries of x [n] (static k <= n), largest first: `jax.lax.top_k`
    on the CPU; on an accelerator k passes of max and argmax (ties to the lower index), which under vmap are
    reductions along the entries where top_k sorts (TPU v5e, the security redispatch of tso-case118 at 16,384
    envs: a fifth less time)."""
    if jax.default_backend() == "cpu":
        return jax.lax.top_k(x, k)
    pos, taken, values, index = jnp.arange(x.shape[0]), jnp.zeros(x.shape, bool), [], []
    for _ in range(k):
        v = jnp.max(jnp.where(taken, -jnp.inf, x))
        i = jnp.argmax((x == v) & ~taken)   # the first entry not taken at the largest value
        taken = taken | (pos == i)
        values.append(v)
        index.append(i)
    return jnp.stack(values), jnp.stack(index)


ONE_HOT_ROWS, ONE_HOT_LIMIT = 4096, 2 ** 17   # take_rows: the largest table (rows; rows x row size) picked by a one-hot product


def bf16_parts(x):
    """float32 x [n, w] as bfloat16 [n, 3w]: [hi, mid, lo] with hi + (mid + lo) == x to the bit. hi is x's
    sign, exponent and first 7 fraction bits (a truncation: exact in bfloat16), mid the same of the rest, lo
    what is left, at most 8 significant bits: exact too. (Values below 2^-110 may lose their last bits where
    lo underflows.)"""
    cut = lambda v: jax.lax.bitcast_convert_type(  # noqa: E731
        jax.lax.bitcast_convert_type(v, jnp.uint32) & jnp.uint32(0xFFFF0000), jnp.float32)
    hi = cut(x)
    rest = x - hi
    mid = cut(rest)
    return jnp.concatenate([hi, mid, rest - mid], 1).astype(jnp.bfloat16)


def take_rows(table, idx, per_env: bool = False):
    """table[idx]: the rows at traced indices `idx` (any shape) of `table` [n, ...]. On the CPU, or from a table
    of more than `ONE_HOT_ROWS` rows or `ONE_HOT_LIMIT` entries, a gather. On an accelerator, where a gather at
    traced indices is slow, one of three exact picks (TPU v5e, 16,384 envs):
    - a table of the task's (the same for every env: loads, forecasts, sensitivities) by the product of the
      indices' one-hot [..., n] with it, a float32 table of more than one column as its three bfloat16 parts
      (`bf16_parts`) in one bfloat16 product, which picks each part exactly: the rows to the bit in one pass
      of the matrix unit where a float32 product at full precision takes six (tso-case14's bare step 1.65x
      faster; a 186-column pick 5.5x). As products the picks ran the bare step 1.5x faster than gathers on
      tso-case14, 1.1x on tso-case118 (3,072-row tables) and the security redispatch 1.5-1.8x.
    - `per_env`, a table each env builds (under vmap a [batch, n, ...] array of a few rows), by a select and a
      sum, which XLA fuses with the table's making where a product needs it in memory (the redispatch with
      its peak plan, tso-case14: 3.7x faster than by products).
    - a vector (one column), or a float64 table, by the product at full precision: the vectors the
      redispatch builds ran 13% faster so than by a select and a sum (tso-case118), 1.7x faster than as
      bfloat16 parts.
    A gather of 16,384 rows took ~80 us whatever their width, a product ~40 us up to ~60 columns of parts
    from 3,072 rows and 220 us for 354 (tso-case118's loads): tables of more than 2^17 entries go by the
    gather (tso-case118's bare rollout 1.23x faster than with the limit at 2^19).
    Integer and bool tables: a select and a sum. A floating table picked by a product must be finite (0 x NaN
    is NaN)."""
    idx = jnp.asarray(idx)
    if table.size == 0:   # e.g. no outage slots: nothing to pick
        return jnp.zeros(idx.shape + table.shape[1:], table.dtype)
    if jax.default_backend() == "cpu" or table.shape[0] > ONE_HOT_ROWS or table.size > ONE_HOT_LIMIT:
        return table[idx]
    hot = idx.reshape(-1, 1) == jnp.arange(table.shape[0])
    rows = table.reshape(table.shape[0], -1)
    if per_env or not jnp.issubdtype(table.dtype, jnp.floating):   # the selected row summed (exact)
        flat = jnp.sum(jnp.where(hot[..., None], rows, jnp.zeros((), table.dtype)), axis=1, dtype=table.dtype)
    elif table.dtype == jnp.float32 and rows.shape[1] > 1:
        hi, mid, lo = jnp.split(jnp.dot(hot.astype(jnp.bfloat16), bf16_parts(rows), precision=jax.lax.Precision.HIGHEST,
                                        preferred_element_type=jnp.float32), 3, 1)
        flat = hi + (mid + lo)
    else:
        flat = jnp.dot(hot.astype(table.dtype), rows, precision=jax.lax.Precision.HIGHEST)
    return flat.reshape(idx.shape + table.shape[1:])


def day_row(table, day, t):
    """table[day, t] of a [n_days, T, ...] table (a task's loads, prices, forecasts) at traced `day` and step
    `t`, as one row pick (`take_rows`) of the table seen as [n_days x T, ...]."""
    n_days, steps = table.shape[:2]
    return take_rows(table.reshape((n_days * steps,) + table.shape[2:]), day * steps + t)


def day_rows(tables, day, t) -> list:
    """[table[day, t] for table in `tables`] (float tables [n_days, T, ...] of one dtype) at traced `day` and
    step `t`. On an accelerator the tables side by side are one row pick: a pick of 16,384 rows costs about
    as much for 3 columns as for 60 (TPU v5e: a product ~40 us, a gather ~80 us). On the CPU each table is
    its own gather (no copy of the tables a step)."""
    if jax.default_backend() == "cpu" or len(tables) == 1:
        return [day_row(x, day, t) for x in tables]
    flat = [x.reshape(x.shape[:2] + (int(np.prod(x.shape[2:])),)) for x in tables]
    rows = day_row(jnp.concatenate(flat, -1), day, t)
    cuts = np.cumsum([f.shape[-1] for f in flat])[:-1].tolist()
    return [r.reshape(x.shape[2:]) for r, x in zip(jnp.split(rows, cuts), tables)]


def held_least_norm_step(a, r, x, lo, hi, free, weight, damping):
    """The least change d of x [n], weighted by `weight` (scalar or [n]), with a d = r (rows `a` [m, n], m
    small and static) over the `free` columns: d = W^-1 a' (a W^-1 a' + damping)^-1 r, `damping` relative
    to the mean diagonal (Levenberg-Marquardt); then solved again with the columns that d would push past
    [lo, hi] at x held. The step of both operator corrections (`safety.redispatch.secure_redispatch`,
    `safety.voltage.voltage_correction`). The damping's floor (sqrt of the dtype's tiny) keeps a system with
    every column held finite (d = 0) where the tiny itself would overflow r / damping."""
    def solve(free):
        af = jnp.where(free[None, :], a, 0.0)
        aw = af / weight
        gram = jnp.sum(aw[:, None, :] * af[None, :, :], -1)   # not a dot: XLA's CPU batched dot is 20x slower from m = 4
        damp = damping * jnp.trace(gram) / a.shape[0] + jnp.sqrt(jnp.finfo(x.dtype).tiny)
        return jnp.sum(small_solve(gram + damp * jnp.eye(a.shape[0], dtype=x.dtype), r, pivot=False)[:, None] * aw, 0)

    d = solve(free)
    return solve(free & ~(((x <= lo) & (d < 0)) | ((x >= hi) & (d > 0))))



def held_projection_step(a, r, n_eq, x, lo, hi, damping, sweeps: int):
    """The least change d of x [n] with a d <= r on the rows of `a` [m, n] (m small and static) but the
    last `n_eq`, which hold as equalities (a d = r): the inequality counterpart of `held_least_norm_step`
    (unit weights), for rows that may end inside their limit: a line below its rating is not pushed to it,
    so more rows than free columns can all be met where a point meets them. By Hildreth's coordinate ascent
    on the dual, `sweeps` Gauss-Seidel passes (static): d = -a' lam, lam minimising lam' G lam / 2 + lam' r
    over lam >= 0 on the inequality rows (G = a a' + damping, `damping` relative to its mean diagonal);
    then solved again with the columns that d would push past [lo, hi] at x held. Where no point meets
    every row, d stays finite (the damping bounds lam) and the later rows have the last word (put the
    equalities last). Checked by hand in tests/test_envs.py."""
    m = a.shape[0]

    def solve(free):
        af = jnp.where(free[None, :], a, 0.0)
        gram = jnp.sum(af[:, None, :] * af[None, :, :], -1)   # as in held_least_norm_step: no batched dot
        gram = gram + (damping * jnp.trace(gram) / m + jnp.sqrt(jnp.finfo(x.dtype).tiny)) * jnp.eye(m, dtype=x.dtype)
        g = [[gram[i, j] for j in range(m)] for i in range(m)]

        def sweep(_, lam):
            lam = list(lam)
            for i in range(m):   # each row sees the others' latest multipliers
                dot = g[i][0] * lam[0]
                for j in range(1, m):
                    dot = dot + g[i][j] * lam[j]
                new = lam[i] - (dot + r[i]) / g[i][i]
                lam[i] = new if i >= m - n_eq else jnp.maximum(new, 0.0)
            return tuple(lam)

        # the multipliers are m scalars, not an [m] vector: under vmap each is one [batch] array, and a sweep is
        # elementwise arithmetic on them, which an accelerator fuses into one kernel (a sum along [batch, m] is
        # a reduction, which ends a kernel: with one per row and sweep the redispatch of tso-case5 and
        # tso-case14 took a third more time on a TPU v5e); nor a dot: under vmap a batched matrix product
        lam = jax.lax.fori_loop(0, sweeps, sweep, tuple(jnp.zeros((), x.dtype) for _ in range(m)))
        return -jnp.sum(jnp.stack(lam)[:, None] * af, 0)

    d = solve(jnp.ones(x.shape, bool))
    return solve(~(((x <= lo) & (d < 0)) | ((x >= hi) & (d > 0))))


def keep_compiled_programs() -> None:
    """Keep compiled programs on disk between calls (JAX's persistent compilation cache), so that a second
    `evogrid` call (or Python session: every `Workflow` turns it on when built) skips the XLA compilation of
    every program it compiled before (a resumed or repeated run starts in seconds): in
    $XDG_CACHE_HOME/evogrid/jax (default ~/.cache) unless JAX_COMPILATION_CACHE_DIR
    names another directory; EVOGRID_COMPILE_CACHE=0 leaves JAX's setting alone. Every program is kept,
    the small ones too (JAX keeps only those over 1 s by default): the hundred-odd small programs that
    building a task and a workflow compiles cost seconds together, and loading one costs about a millisecond
    (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS overrides)."""
    if os.environ.get("EVOGRID_COMPILE_CACHE", "1") == "0":
        return
    if not jax.config.jax_compilation_cache_dir:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        jax.config.update("jax_compilation_cache_dir", str(root / "evogrid" / "jax"))
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
