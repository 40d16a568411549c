"""Line outages in the DC model: outage distribution factors and post-outage flows (N-1 screening).

Taking branch k out of service is, for every other branch, the same as keeping it and injecting a
transfer d_k from its from bus to its to bus sized so that the whole transfer flows through k itself:
then the rest of the grid sees none of k's flow. With the branch-to-branch sensitivities
ISF = PTDF @ A^T (ISF[l, k]: MW on branch l per MW transferred along branch k), a set K of outaged
branches needs (I - ISF[K, K]) d = f[K], and the post-outage flows are f + ISF[:, K] d
(the low-rank, Woodbury form; one outage gives the classical LODF:
LODF[l, k] = ISF[l, k] / (1 - ISF[k, k])). The transfer through k includes its phase-shifter term,
so shifters leaving service are handled too.

An outage set islands the grid exactly when I - ISF[K, K] is singular (for one branch: 1 - ISF[k, k]
= 0, a *bridge*). Such sets are reported, never divided by: `lodf` zeroes a bridge's column and
`outage_flows` returns the pre-outage flows (outaged branches at 0) with `islanded` set.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import Case
from evogrid.physics._common import as_float

BRIDGE_TOL = 1e-8  # |1 - ISF[k, k]| below this (float64, at set-up) marks a bridge


@struct.dataclass
class OutageModel:
    """isf:    [n_branch, n_branch] MW on branch l per MW transferred from branch k's from bus to its to bus
    lodf:   [n_branch, n_branch] MW change on branch l per MW flowing on k before k's outage (column k;
            -1 on the diagonal; a bridge's column is 0)
    bridge: [n_branch] bool, the single outages that island the grid"""

    isf: jnp.ndarray
    lodf: jnp.ndarray
    bridge: jnp.ndarray


def make_outage_model(case: Case) -> OutageModel:
    """Built once in float64 from the case's PTDF (the DC model of `make_dc_network`)."""
    from evogrid.physics.dc import make_dc_network

    with jax.enable_x64(True):
        ptdf = np.asarray(make_dc_network(case).ptdf, np.float64)
    isf = ptdf[:, case.f_bus] - ptdf[:, case.t_bus]
    factors, bridge = lodf(isf)
    return OutageModel(isf=as_float(isf), lodf=as_float(factors), bridge=jnp.asarray(bridge))


def lodf(isf: np.ndarray, tol: float = BRIDGE_TOL):
    """Line outage distribution factors from the branch-to-branch sensitivities (`OutageModel.isf`;
    NumPy, float64). Returns (lodf [n_branch, n_branch], bridge [n_branch] bool)."""
    isf = np.asarray(isf, np.float64)
    denom = 1.0 - np.diag(isf)
    bridge = np.abs(denom) < tol
    factors = isf / np.where(bridge, 1.0, denom)[None, :]
    factors[:, bridge] = 0.0
    np.fill_diagonal(factors, -1.0)
    return factors, bridge


def n1_flows(model: OutageModel, flow: jnp.ndarray, contingencies: jnp.ndarray | None = None) -> jnp.ndarray:
    """Post-outage flows of single outages: row i is every branch's flow (MW) after contingency i
    (`contingencies`, default every branch) leaves service; one product with the LODF, no solve.
    Rows of bridges (`model.bridge`) carry no meaning: mask them."""
    factors = model.lodf if contingencies is None else model.lodf[:, contingencies]
    out = flow if contingencies is None else flow[contingencies]
    return flow[None, :] + factors.T * out[:, None]


def outage_flows(model: OutageModel, flow: jnp.ndarray, out: jnp.ndarray, tol: float | None = None):
    """DC flows after the branches `out` leave service together.

    Args:
      flow: [n_branch] MW before the outages (the intact grid's flows, e.g. `dc_line_flows`).
      out:  [k] int32 branch indices, -1 for an unused slot (k is static; repeated indices count once).
      tol:  |det(I - ISF[K, K])| below which the set islands the grid (default: sqrt of the dtype's eps).
    Returns:
      (post [n_branch] MW, outaged branches at exactly 0; islanded [] bool). An islanding set returns
      the pre-outage flows with the outaged branches at 0, so every output stays finite.
    """
    n_branch = flow.shape[0]
    k = out.shape[0]
    slot = jnp.arange(k)
    earlier_same = (out[:, None] == out[None, :]) & (slot[None, :] < slot[:, None])
    valid = (out >= 0) & (out < n_branch) & ~jnp.any(earlier_same, axis=1)
    idx = jnp.where(valid, out, 0)
    both = valid[:, None] & valid[None, :]
    a = jnp.eye(k, dtype=flow.dtype) - jnp.where(both, model.isf[idx][:, idx], 0.0)
    tol = float(jnp.finfo(flow.dtype).eps) ** 0.5 if tol is None else tol
    islanded = jnp.abs(jnp.linalg.det(a)) < tol
    rhs = jnp.where(valid, flow[idx], 0.0)
    transfer = jnp.linalg.solve(jnp.where(islanded, jnp.eye(k, dtype=flow.dtype), a), rhs)
    transfer = jnp.where(valid & ~islanded, transfer, 0.0)
    post = flow + model.isf[:, idx] @ transfer
    outaged = jnp.any((jnp.arange(n_branch)[:, None] == idx[None, :]) & valid[None, :], axis=1)
    return jnp.where(outaged, 0.0, post), islanded
