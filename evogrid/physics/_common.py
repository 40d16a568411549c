"""Helpers shared by the physics kernels: dtypes and branch admittances."""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from evogrid.case.matpower import BR_B, BR_R, BR_X, BS, GS, SHIFT, Case


def float_dtype():
    """float32 by default, float64 when `jax_enable_x64` is on (at the time of the call; no array is made,
    so set-up code that calls this per field dispatches nothing)."""
    return jax.dtypes.canonicalize_dtype(np.float64)


def complex_dtype():
    return jnp.result_type(float_dtype(), jnp.complex64)


def as_float(x) -> jnp.ndarray:
    return jnp.asarray(np.asarray(x), dtype=float_dtype())


@contextlib.contextmanager
def host_float64():
    """Set-up arithmetic in float64 on the host CPU: x64 on and the CPU device as JAX's default inside.
    An accelerator has no float64 LU (a TPU refuses one: "Only F32 and C64 types are implemented in
    LuDecomposition") and runs float64 slowly where it has it; what is computed once belongs on the host."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]), jax.enable_x64(True):
        yield


def to_compute(tree):
    """Every array leaf of `tree` (built on the host, maybe in float64) in the caller's dtypes (float32
    unless x64 is on; complex and integer likewise) on JAX's default device, uncommitted as `as_float` makes
    them: what the traced code sees."""
    def leaf(x):
        if not isinstance(x, (jax.Array, np.ndarray)):
            return x
        x = np.asarray(x)
        return jnp.asarray(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype))
    return jax.tree_util.tree_map(leaf, tree)


NO_FLOAT64 = ("tpu",)   # backends without float64 linear algebra (a TPU: "Only F32 and C64 types are implemented")


def check_float64_device():
    """Refuse float64 (x64 on) where the default device cannot run it, before anything is built or compiled.
    Inside `host_float64` (a baseline's set-up after training on a chip) the default device is the CPU."""
    device = jax.config.jax_default_device
    backend = jax.default_backend() if device is None else device if isinstance(device, str) else device.platform
    if float_dtype() == np.float64 and backend in NO_FLOAT64:
        raise ValueError(f"float64 was asked for (jax_enable_x64 is on) but the default device is a {backend.upper()}, "
                         "which has no float64 linear algebra: unset JAX_ENABLE_X64 to run in float32 there (the set-up "
                         "is float64 on the host either way), or run float64 on the CPU with JAX_PLATFORMS=cpu")


def host_setup(make_params):
    """Decorate a task's `make_*_params`: it runs under `host_float64` (ratings, ramp rules, PTDF/LODF,
    start-of-day power flows: all in float64 on the host CPU) and its params come back in the caller's
    dtypes on the default device (`to_compute`). One rule for every task, whatever device JAX defaults to."""
    @functools.wraps(make_params)
    def built(*args, **kwargs):
        check_float64_device()
        with host_float64():
            params = make_params(*args, **kwargs)
        return to_compute(params)
    return built


def branch_admittances(case: Case):
    """MATPOWER's makeYbus branch model in p.u. (numpy complex128), one entry per branch.

    Returns (yff, yft, ytf, ytt, ysh): the pi-model with an ideal transformer of
    complex ratio tap * exp(j * shift) on the from side, and bus shunts
    (Gs + j Bs) / baseMVA.
    """
    br = case.branch
    ys = 1.0 / (br[:, BR_R] + 1j * br[:, BR_X])
    bc = br[:, BR_B]
    tap = case.tap * np.exp(1j * np.deg2rad(br[:, SHIFT]))
    ytt = ys + 0.5j * bc
    yff = ytt / (tap * np.conj(tap))
    yft = -ys / np.conj(tap)
    ytf = -ys / tap
    ysh = (case.bus[:, GS] + 1j * case.bus[:, BS]) / case.base_mva
    return yff, yft, ytf, ytt, ysh
