"""DC power flow with a PTDF built once at set-up (MATPOWER's makeBdc / dcpf conventions).

Branch susceptance b = 1 / (x * tap); phase shifters enter as fixed injections.
At run time a flow is one matrix-vector product: flows = PTDF @ p + flow0 (a task's loads' share of it
computed once on the host: `injection_flows`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import BR_X, GS, SHIFT, VA, Case
from evogrid.physics._common import as_float


@struct.dataclass
class DCNetwork:
    """Arrays of the DC model of one case (dtype set when built).

    ptdf:      [n_branch, n_bus]  MW flow per MW injected at a bus, withdrawn at the reference bus
    flow0:     [n_branch]         MW flow with no injections (phase shifters, shunts)
    angle_sens:[n_bus, n_bus]     rad per MW injected (zero row/column at the reference bus)
    angle0:    [n_bus]            rad with no injections
    ref_mask:  [n_bus]            1.0 at the reference bus
    gs_total:  []                 MW drawn by bus shunt conductances at V = 1 p.u.
    """

    ptdf: jnp.ndarray
    flow0: jnp.ndarray
    angle_sens: jnp.ndarray
    angle0: jnp.ndarray
    ref_mask: jnp.ndarray
    gs_total: jnp.ndarray


def _reduced_b(case: Case):
    """(branch-bus incidence [n_branch, n_bus], the same scaled by the susceptances (sparse), the reduced
    B's sparse LU, the non-reference buses' mask, the phase shifters' branch injections p.u.)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    n, ref = case.n_bus, case.ref_bus
    b = 1.0 / (case.branch[:, BR_X] * case.tap)
    rows = np.arange(case.n_branch)
    inc = sp.csr_matrix((np.r_[np.ones(case.n_branch), -np.ones(case.n_branch)],   # +1 at from bus, -1 at to bus
                         (np.r_[rows, rows], np.r_[case.f_bus, case.t_bus])), shape=(case.n_branch, n))
    bf = (sp.diags(b) @ inc).tocsr()
    bbus = (inc.T @ bf).tocsc()
    keep = np.arange(n) != ref
    return inc, bf, splu(bbus[keep][:, keep].tocsc()), keep, -b * np.deg2rad(case.branch[:, SHIFT])


def make_dc_network(case: Case) -> DCNetwork:
    """The DC model of `case` (host set-up, float64 under `host_float64`). The branch-bus incidence and B are
    sparse and the reduced B is factored once (SuperLU) and solved for every bus: O(n_bus^2) memory and a
    few seconds at 9,241 buses, where dense products and a dense inverse took 107 s."""
    n, ref, base = case.n_bus, case.ref_bus, case.base_mva
    inc, bf, lu, keep, pf_inj = _reduced_b(case)
    pbus_inj = inc.T @ pf_inj
    gs = case.bus[:, GS] / base
    va_ref = np.deg2rad(case.bus[ref, VA])
    x = np.zeros((n, n))
    x[np.ix_(keep, keep)] = lu.solve(np.eye(n - 1))
    # theta = x @ (p - pbus_inj - gs) + va_ref, with p in p.u. (B's rows sum to zero: the reference angle shifts
    # every angle alike and moves no flow); the flows from the angles relative to the reference, so that a case
    # without phase shifters or shunt conductance has flow0 exactly 0, not round-off of va_ref's differences
    relative = x @ (-pbus_inj - gs)
    angle0 = relative + va_ref
    angle0[ref] = va_ref
    return DCNetwork(
        ptdf=as_float(bf @ x),
        flow0=as_float((bf @ relative + pf_inj) * base),
        angle_sens=as_float(x / base),
        angle0=as_float(angle0),
        ref_mask=as_float(~keep),
        gs_total=as_float(case.bus[:, GS].sum()),
    )


def injection_flows(case: Case, p_bus_mw: np.ndarray) -> np.ndarray:
    """The branch flows [..., n_branch] MW of many injection vectors `p_bus_mw` [..., n_bus] (the reference
    bus's entries ignored; flow0 not included): PTDF @ p, by sparse solves with the reduced B on the host in
    float64 (a day set of 9241pegase's loads in seconds, where the dense product is 455 GFLOP)."""
    _, bf, lu, keep, _ = _reduced_b(case)
    p = np.asarray(p_bus_mw, np.float64).reshape(-1, case.n_bus)
    theta = np.zeros((case.n_bus, p.shape[0]))
    theta[keep] = lu.solve(np.ascontiguousarray(p[:, keep].T))
    return np.asarray(bf @ theta).T.reshape(*np.shape(p_bus_mw)[:-1], case.n_branch)


def dc_line_flows(net: DCNetwork, p_bus_mw: jnp.ndarray):
    """Branch flows only (no angles): one matrix-vector product. Returns (flow_mw, p_ref_mw); see `dc_power_flow`."""
    p = p_bus_mw * (1.0 - net.ref_mask)
    return net.ptdf @ p + net.flow0, net.gs_total - p.sum()


def dc_power_flow(net: DCNetwork, p_bus_mw: jnp.ndarray):
    """Solve the DC power flow with the reference bus as slack.

    Args:
      p_bus_mw: [n_bus] net injection (generation - load) in MW; the entry at the
        reference bus is ignored and replaced by the balancing value.
    Returns:
      (va_deg [n_bus] degrees, flow_mw [n_branch] MW from->to, p_ref_mw [] the net
      injection the reference bus must supply: bus shunt draw minus every other injection).
    """
    flow, p_ref = dc_line_flows(net, p_bus_mw)
    va = net.angle_sens @ (p_bus_mw * (1.0 - net.ref_mask)) + net.angle0
    return jnp.rad2deg(va), flow, p_ref
