"""AC power flow by Newton-Raphson in polar coordinates (MATPOWER's newtonpf).

The solver iterates until the largest mismatch is below `tol` p.u. or `iters` (a static
maximum) is reached, with a `lax.while_loop`; under vmap the loop runs until the slowest
member of the batch has converged, members that converged are held. The result carries a
converged flag. Tolerances follow the dtype (`default_tol`). Bus types follow MATPOWER's
`bustypes`: a PV or reference bus with no in-service generator is treated as PQ. Generator
reactive limits are not enforced by `newton_raphson` (MATPOWER's default, ENFORCE_Q_LIMS = 0);
`newton_raphson_q_limits` enforces them by PV -> PQ switching in a fixed number of rounds.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import BUS_TYPE, PV, REF, VA, VG, VM, Case
from evogrid.physics._common import branch_admittances, complex_dtype


@struct.dataclass
class ACNetwork:
    """Arrays of the AC model of one case (p.u. on `base_mva`).

    ybus: [n_bus, n_bus] complex bus admittance matrix
    yff, yft, ytf, ytt: [n_branch] complex branch admittances; f_bus, t_bus: [n_branch] int
    pvpq: [n_pv + n_pq] int, pq: [n_pq] int  bus indices whose angle / magnitude are unknowns
    v0: [n_bus] complex starting voltage (generator set-points at PV/ref buses, case Vm/Va elsewhere)
    """

    ybus: jnp.ndarray
    yff: jnp.ndarray
    yft: jnp.ndarray
    ytf: jnp.ndarray
    ytt: jnp.ndarray
    f_bus: jnp.ndarray
    t_bus: jnp.ndarray
    pvpq: jnp.ndarray
    pq: jnp.ndarray
    v0: jnp.ndarray
    base_mva: float = struct.field(pytree_node=False, default=100.0)


def bus_types(case: Case):
    """(ref, pv, pq) internal bus indices as MATPOWER's bustypes defines them."""
    has_gen = np.zeros(case.n_bus, bool)
    has_gen[case.gen_bus] = True
    types = case.bus[:, BUS_TYPE]
    ref = np.flatnonzero((types == REF) & has_gen)
    if ref.size == 0:
        raise ValueError(f"{case.name}: the reference bus has no in-service generator; AC power flow needs one")
    pv = np.flatnonzero((types == PV) & has_gen)
    pq = np.setdiff1d(np.arange(case.n_bus), np.concatenate([ref[:1], pv]))
    return ref[:1], pv, pq


def make_ac_network(case: Case) -> ACNetwork:
    yff, yft, ytf, ytt, ysh = branch_admittances(case)
    n, f, t = case.n_bus, case.f_bus, case.t_bus
    ybus = np.diag(ysh).astype(complex)
    np.add.at(ybus, (f, f), yff)
    np.add.at(ybus, (f, t), yft)
    np.add.at(ybus, (t, f), ytf)
    np.add.at(ybus, (t, t), ytt)
    ref, pv, pq = bus_types(case)
    v0 = case.bus[:, VM] * np.exp(1j * np.deg2rad(case.bus[:, VA]))
    gen_at = np.concatenate([ref, pv])
    vg = np.zeros(n)
    vg[case.gen_bus] = case.gen[:, VG]  # with several units on a bus the last one's set-point wins, as in MATPOWER's
    # runpf: V0(gbus) = gen(on, VG) ./ abs(V0(gbus)) .* V0(gbus) assigns in generator order
    v0[gen_at] = vg[gen_at] * v0[gen_at] / np.abs(v0[gen_at])
    cx = lambda a: jnp.asarray(a, dtype=complex_dtype())  # noqa: E731
    return ACNetwork(
        ybus=cx(ybus), yff=cx(yff), yft=cx(yft), ytf=cx(ytf), ytt=cx(ytt),
        f_bus=jnp.asarray(f), t_bus=jnp.asarray(t),
        pvpq=jnp.asarray(np.concatenate([pv, pq]).astype(np.int32)), pq=jnp.asarray(pq.astype(np.int32)),
        v0=cx(v0), base_mva=case.base_mva,
    )


def _mismatch(net: ACNetwork, v, s_bus):
    mis = v * jnp.conj(net.ybus @ v) - s_bus
    return jnp.concatenate([mis.real[net.pvpq], mis.imag[net.pq]])


def jacobian(net: ACNetwork, v):
    """Power-flow Jacobian d[P(pvpq); Q(pq)] / d[Va(pvpq); Vm(pq)] at voltage v: [m, m] real, m = n_pv + 2 n_pq."""
    ibus = net.ybus @ v
    vnorm = v / jnp.abs(v)
    diag_i = jnp.diag(ibus)
    ds_dvm = v[:, None] * jnp.conj(net.ybus * vnorm[None, :]) + jnp.diag(jnp.conj(ibus) * vnorm)
    ds_dva = 1j * v[:, None] * jnp.conj(diag_i - net.ybus * v[None, :])
    j11 = ds_dva.real[net.pvpq][:, net.pvpq]
    j12 = ds_dvm.real[net.pvpq][:, net.pq]
    j21 = ds_dva.imag[net.pq][:, net.pvpq]
    j22 = ds_dvm.imag[net.pq][:, net.pq]
    return jnp.block([[j11, j12], [j21, j22]])


def default_tol(dtype) -> float:
    """Mismatch tolerance in p.u. that the dtype can reach: 1e-8 in float64 (MATPOWER's default), 1e-4 in
    float32 (round-off of V conj(Ybus V) with admittances up to ~1e3 p.u. is ~1e-5)."""
    return 1e-8 if jnp.finfo(dtype).bits == 64 else 1e-4


def newton_raphson(net: ACNetwork, s_bus: jnp.ndarray, v0: jnp.ndarray | None = None, iters: int = 10,
                   tol: float | None = None, jacobian_inverse: jnp.ndarray | None = None):
    """Solve S_bus = V * conj(Ybus V) for the bus voltages.

    Args:
      s_bus: [n_bus] complex net injection (generation - load) in p.u.; entries that are
        unknowns of the problem (P at the reference bus, Q at PV and reference buses) are ignored.
      v0: [n_bus] complex starting point (default `net.v0`); its magnitudes at PV and
        reference buses, and its angle at the reference bus, are held fixed.
      iters: static maximum number of steps; the loop stops earlier once max |mismatch| < tol.
      tol: convergence threshold in p.u. (default: `default_tol` of the dtype).
      jacobian_inverse: optional [m, m] inverse of `jacobian(net, v_ref)` at some nearby solved
        state. Given it, the solver runs the chord method (the same update with this fixed
        matrix): each step is a matrix-vector product instead of an LU factorisation (~60x
        fewer flops on case118), convergence is linear instead of quadratic (allow more
        steps), and the fixed point, hence the answer, is the same. Check `converged`.
    Returns:
      (v [n_bus] complex, converged bool, max_mismatch p.u.)
    """
    v0 = net.v0 if v0 is None else v0
    tol = default_tol(v0.real.dtype) if tol is None else tol
    s_bus = s_bus.astype(v0.dtype)

    def keep_going(carry):
        i, _, f = carry
        return (i < iters - 1) & (jnp.max(jnp.abs(f)) >= tol)  # False once converged, or on NaN

    # the loop sees constants only (no derivative flows through it; see the step after it)
    fixed_net, s_fixed, fixed_jinv, v_start = jax.lax.stop_gradient((net, s_bus, jacobian_inverse, v0))

    def newton_step(carry):
        i, v, f = carry
        v = _newton_update(fixed_net, v, f, fixed_jinv)
        return i + 1, v, _mismatch(fixed_net, v, s_fixed)

    _, v, _ = jax.lax.while_loop(keep_going, newton_step, (jnp.int32(0), v_start, _mismatch(fixed_net, v_start, s_fixed)))
    v = _held_from(v, v0, jnp.ones(v.shape, bool).at[net.pq].set(False), jnp.ones(v.shape, bool).at[net.pvpq].set(False))
    # one more step, outside the loop, from the loop's (gradient-stopped) point: it takes a converged
    # point to the dtype's round-off, and it carries the implicit-function derivative
    # dV/dS = -J^-1 dF/dS through the solution, so the solver is differentiable (reverse mode too)
    v = _newton_update(net, v, _mismatch(net, v, s_bus), jacobian_inverse)
    mismatch = jnp.max(jnp.abs(_mismatch(net, v, s_bus)))
    return v, mismatch < tol, mismatch


def newton_raphson_q_limits(net: ACNetwork, s_bus: jnp.ndarray, q_min: jnp.ndarray, q_max: jnp.ndarray,
                            v0: jnp.ndarray | None = None, rounds: int = 4, iters: int = 10, tol: float | None = None,
                            v_set: jnp.ndarray | None = None):
    """Newton-Raphson with generator reactive limits (MATPOWER's ENFORCE_Q_LIMS = 1, pandapower's
    `enforce_q_lims=True`): solve; every PV bus whose reactive injection lies outside [q_min, q_max]
    becomes a PQ bus with its injection at the violated limit; solve again; `rounds` times at most
    (static), switching never back. A solve that fails ends the rounds (MATPOWER's runpf switches after a
    converged solve only; PYPOWER's port also from a failed one): under vmap, a batch member whose first
    solve fails no longer holds every later round of the batch to the iteration cap. The reference bus keeps its voltage (its reactive output is not
    limited), as in pandapower. PV set-points are `v_set`'s magnitudes (default `net.v0`'s). Shapes stay static: every non-reference |V| is an unknown, and a bus
    still in PV mode has the equation |V| = set-point instead of its Q balance.

    Args:
      s_bus: [n_bus] complex net injection in p.u. as for `newton_raphson`.
      q_min, q_max: [n_bus] p.u. limits of the bus's net reactive injection (units' Qmin/Qmax summed,
        minus the bus's reactive load); only PV buses' entries are used.
    Returns:
      (v, converged: solved and within every limit after the last round, max_mismatch p.u.,
       switched [n_bus] bool: the buses that hit a limit). The derivative (one Newton step outside the
       loops, as in `newton_raphson`) is the solution's for the final bus types; none through the switching.
    """
    v0 = net.v0 if v0 is None else v0
    tol = default_tol(v0.real.dtype) if tol is None else tol
    n_bus, n = v0.shape[0], net.pvpq.shape[0]
    is_pv = jnp.ones(n_bus, bool).at[net.pq].set(False)[net.pvpq]  # [n] PV buses, in pvpq order
    vset_live = jnp.abs(net.v0 if v_set is None else v_set)[net.pvpq]  # v0 (a warm start) is where Newton begins
    # the loops see constants only; the step after them carries the derivative
    fixed_net, s_live, v0_live = net, s_bus, v0
    net, s_bus, q_min, q_max, v0, vset = jax.lax.stop_gradient((net, s_bus, q_min, q_max, v0, vset_live))
    full = net.replace(pq=net.pvpq)  # |V| unknown at every non-reference bus
    lower = jnp.concatenate([jnp.zeros((n, n), v0.real.dtype), jnp.eye(n, dtype=v0.real.dtype)], axis=1)

    def residual(v, s, hold, vset=vset, full=full):
        f = _mismatch(full, v, s)
        return jnp.concatenate([f[:n], jnp.where(hold, jnp.abs(v)[net.pvpq] - vset, f[n:])])

    def newton_update(v, f, hold, full=full):
        """One Newton step from v with residual f (`residual(v, ...)`)."""
        jac = jacobian(full, v)
        jac = jnp.concatenate([jac[:n], jnp.where(hold[:, None], lower, jac[n:])])
        dx = jnp.linalg.solve(jac, f)
        va = jnp.angle(v).at[net.pvpq].add(-dx[:n])
        vm = jnp.abs(v).at[net.pvpq].add(-dx[n:])
        return vm * jnp.exp(1j * va).astype(v.dtype)

    def solve(v, s, hold, ok):
        def keep_going(carry):   # not at all after a round whose solve failed (`ok` False)
            i, _, f = carry
            return ok & (i < iters) & (jnp.max(jnp.abs(f)) >= tol)

        def step(carry):
            i, v, f = carry
            v = newton_update(v, f, hold)
            return i + 1, v, residual(v, s, hold)

        _, v, f = jax.lax.while_loop(keep_going, step, (jnp.int32(0), v, residual(v, s, hold)))
        return v, jnp.max(jnp.abs(f))

    def one_round(carry, _):
        v, s, hold, ok = carry
        v, mismatch = solve(v, s, hold, ok)
        ok = ok & (mismatch < tol)   # a failed solve ends the rounds: no switching from it (MATPOWER's runpf)
        q = jnp.imag(v * jnp.conj(net.ybus @ v))[net.pvpq]
        qlo, qhi = q_min[net.pvpq], q_max[net.pvpq]
        over, under = ok & hold & (q > qhi), ok & hold & (q < qlo)
        limit = jnp.where(over, qhi, qlo)
        fix = over | under
        s = s.at[net.pvpq].set(jnp.where(fix, s[net.pvpq].real + 1j * limit, s[net.pvpq]))
        return (v, s, hold & ~fix, ok), (mismatch, jnp.any(fix))

    s0 = s_bus.astype(v0.dtype)
    (v, s, hold, ok), _ = jax.lax.scan(one_round, (v0, s0, is_pv, jnp.asarray(True)), None, length=rounds)
    v, _ = solve(v, s, hold, ok)  # the last switches' solution
    # one more step from it with the live inputs (switched buses' reactive injection at their limit)
    s_live = s_live.astype(v0.dtype)
    s_live = s_live.at[net.pvpq].set(jnp.where(hold, s_live[net.pvpq], s_live[net.pvpq].real + 1j * s[net.pvpq].imag))
    live_full = fixed_net.replace(pq=fixed_net.pvpq)
    ref = jnp.ones(n_bus, bool).at[net.pvpq].set(False)
    v = _held_from(v, v0_live, ref, ref)   # the PV buses' set-points enter through the residual
    v = newton_update(v, residual(v, s_live, hold, vset_live, live_full), hold, live_full)
    mismatch = jnp.max(jnp.abs(residual(v, s, hold)))
    q = jnp.imag(v * jnp.conj(net.ybus @ v))[net.pvpq]
    slack = 10 * tol
    within = ~jnp.any(hold & ((q > q_max[net.pvpq] + slack) | (q < q_min[net.pvpq] - slack)))
    switched = jnp.zeros(n_bus, bool).at[net.pvpq].set(is_pv & ~hold)
    return v, (mismatch < tol) & within, mismatch, switched


def _held_from(v, v0, magnitude, angle):
    """`v` (a gradient-stopped solution) with the derivative of the quantities Newton holds at `v0`'s: the
    magnitudes where `magnitude` (reference and PV buses) and the angle where `angle` (the reference).
    The values stay `v`'s bit for bit (each term added is zero); the Newton step after it then carries
    the solution's derivative with respect to the set-points too."""
    m, a = jnp.abs(v0), jnp.angle(v0)
    dm = jnp.where(magnitude, m - jax.lax.stop_gradient(m), 0.0)
    da = jnp.where(angle, a - jax.lax.stop_gradient(a), 0.0)
    unit = v / jnp.where(jnp.abs(v) > 0, jnp.abs(v), 1.0)
    return v + (dm * unit + 1j * da * v).astype(v.dtype)


def _newton_update(net: ACNetwork, v, f, jacobian_inverse):
    """One (full or chord) Newton update of the voltages from the mismatch f at v."""
    npvpq = net.pvpq.shape[0]
    dx = jnp.linalg.solve(jacobian(net, v), f) if jacobian_inverse is None else jacobian_inverse @ f
    va = jnp.angle(v).at[net.pvpq].add(-dx[:npvpq])
    vm = jnp.abs(v).at[net.pq].add(-dx[npvpq:])
    return vm * jnp.exp(1j * va).astype(v.dtype)


def bus_injections(net: ACNetwork, v: jnp.ndarray) -> jnp.ndarray:
    """Complex power injected at each bus by the network solution, in MVA."""
    return v * jnp.conj(net.ybus @ v) * net.base_mva


def branch_flows(net: ACNetwork, v: jnp.ndarray):
    """(S_from, S_to) complex branch flows in MVA, measured into the branch at each end."""
    vf, vt = v[net.f_bus], v[net.t_bus]
    s_from = vf * jnp.conj(net.yff * vf + net.yft * vt) * net.base_mva
    s_to = vt * jnp.conj(net.ytf * vf + net.ytt * vt) * net.base_mva
    return s_from, s_to
