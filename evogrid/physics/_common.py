"""Helpers shared by the physics kernels: dtypes and branch admittances."""
from __future__ import annotations

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
