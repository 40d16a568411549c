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

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import Case
from evogrid.physics._common import as_float, host_float64

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
    """Built once in float64 from the case's PTDF (the DC model of `make_dc_network`), then cast."""
    from evogrid.physics.dc import make_dc_network

    with host_float64():
        ptdf = make_dc_network(case).ptdf
        isf = ptdf[:, case.f_bus] - ptdf[:, case.t_bus]
        factors, bridge = lodf(isf, BRIDGE_TOL)
        factors, isf, bridge = np.asarray(factors), np.asarray(isf), np.asarray(bridge)
    return OutageModel(isf=as_float(isf), lodf=as_float(factors), bridge=jnp.asarray(bridge))


def lodf(isf: jnp.ndarray, tol: float | None = None):
    """Line outage distribution factors from the branch-to-branch sensitivities (`OutageModel.isf`).
    Returns (lodf [n_branch, n_branch], bridge [n_branch] bool: |1 - ISF[k, k]| < tol, default sqrt(eps))."""
    tol = _default_tol(isf.dtype) if tol is None else tol
    denom = 1.0 - jnp.diagonal(isf)
    bridge = jnp.abs(denom) < tol
    factors = jnp.where(bridge[None, :], 0.0, isf / jnp.where(bridge, 1.0, denom)[None, :])
    n = isf.shape[0]
    return factors.at[jnp.arange(n), jnp.arange(n)].set(-1.0), bridge


def n1_flows(model: OutageModel, flow: jnp.ndarray, contingencies: jnp.ndarray | None = None) -> jnp.ndarray:
    """Post-outage flows of single outages: row i is every branch's flow (MW) after contingency i
    (`contingencies`, default every branch) leaves service; one product with the LODF, no solve.
    Rows of bridges (`model.bridge`) carry no meaning: mask them."""
    factors = model.lodf if contingencies is None else model.lodf[:, contingencies]
    out = flow if contingencies is None else flow[contingencies]
    return flow[None, :] + factors.T * out[:, None]


def _default_tol(dtype) -> float:
    return float(jnp.finfo(dtype).eps) ** 0.5


def _outage_set(model: OutageModel, out: jnp.ndarray, tol: float | None):
    """The compensation system of an outage set: (idx, valid, a = I - ISF[K, K] (identity where a slot is
    unused or the set islands), islanded, outaged [n_branch] bool)."""
    n_branch, k = model.isf.shape[0], out.shape[0]
    dtype = model.isf.dtype
    slot = jnp.arange(k)
    earlier_same = (out[:, None] == out[None, :]) & (slot[None, :] < slot[:, None])
    valid = (out >= 0) & (out < n_branch) & ~jnp.any(earlier_same, axis=1)
    idx = jnp.where(valid, out, 0)
    a = jnp.eye(k, dtype=dtype) - jnp.where(valid[:, None] & valid[None, :], model.isf[idx][:, idx], 0.0)
    islanded = jnp.abs(jnp.linalg.det(a)) < (_default_tol(dtype) if tol is None else tol)
    a = jnp.where(islanded, jnp.eye(k, dtype=dtype), a)
    outaged = jnp.any((jnp.arange(n_branch)[:, None] == idx[None, :]) & valid[None, :], axis=1)
    return idx, valid & ~islanded, a, islanded, outaged


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
    idx, use, a, islanded, outaged = _outage_set(model, out, tol)
    transfer = jnp.where(use, jnp.linalg.solve(a, jnp.where(use, flow[idx], 0.0)), 0.0)
    return jnp.where(outaged, 0.0, flow + model.isf[:, idx] @ transfer), islanded


def contingency_flows(model: OutageModel, flow: jnp.ndarray, out: jnp.ndarray, contingencies: jnp.ndarray,
                      tol: float | None = None):
    """N-1 screening of the grid as it is: flows after each single contingency in `contingencies` [c]
    leaves service on top of the outages `out` [k] in force, from `flow`, the flows with `out` already out
    (`outage_flows`). The sensitivities of the outaged grid come from the same low-rank update,
    ISF'[:, C] = ISF[:, C] + ISF[:, K] G with G = (I - ISF[K, K])^-1 ISF[K, C], so that
    post[c] = flow + (ISF[:, c] + ISF[:, K] G[:, c]) flow[c] / (1 - ISF'[c, c]), the outaged branches at 0.
    Returns (post [c, n_branch] MW, void [c] bool: the contingency islands the grid, is already out, or
    the outages in force island it, so its row means nothing). k = 0 (static) gives `n1_flows`' values.

    Cost: one fused pass over [c, n_branch] per grid. The [n_branch, c] factor matrix of the grid as it
    is is never formed: it would differ per grid of a vmapped batch, and writing it is the bottleneck
    (measured 10x slower on CPU); only parameter-only terms are [c, n_branch] and so shared by a batch."""
    n = flow.shape[0]
    tol = _default_tol(flow.dtype) if tol is None else tol
    # parameter-only: ISF[:, C]^T with the contingency's own entry minus 1 (its post-outage flow is 0)
    base = model.isf[:, contingencies].T - (jnp.arange(n)[None, :] == contingencies[:, None])
    diag = model.isf[contingencies, contingencies]
    void = model.bridge[contingencies]
    in_service = jnp.ones(n, flow.dtype)
    gain = None
    if out.shape[0]:
        idx, use, a, islanded, outaged = _outage_set(model, out, tol)
        gain = jnp.linalg.solve(a, jnp.where(use[:, None], model.isf[idx][:, contingencies], 0.0))  # [k, c]
        gain = jnp.where(use[:, None], gain, 0.0)
        diag = diag + jnp.sum(model.isf[contingencies][:, idx] * gain.T, axis=1)
        void = void | outaged[contingencies] | islanded
        in_service = 1.0 - outaged.astype(flow.dtype)
    denom = 1.0 - diag
    void = void | (jnp.abs(denom) < tol)
    scale = jnp.where(void, 0.0, flow[contingencies] / jnp.where(void, 1.0, denom))  # [c] MW transferred
    post = flow[None, :] + base * scale[:, None]
    for j in range(out.shape[0]):  # rank-k update as broadcasts (k is small and static)
        post = post + (gain[j] * scale)[:, None] * model.isf[:, idx[j]][None, :]
    return post * in_service[None, :], void
