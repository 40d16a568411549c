"""AC power flow by Newton-Raphson in polar coordinates (MATPOWER's newtonpf).

The solver iterates until the largest mismatch is below `tol` p.u. or `iters` (a static
maximum) is reached, with a `lax.while_loop`; under vmap the loop runs until the slowest
member of the batch has converged, members that converged are held. The result carries a
converged flag. Tolerances follow the dtype (`default_tol`). Bus types follow MATPOWER's
`bustypes`: a PV or reference bus with no in-service generator is treated as PQ. Generator
reactive limits are not enforced by `newton_raphson` (MATPOWER's default, ENFORCE_Q_LIMS = 0);
`newton_raphson_q_limits` enforces them by PV -> PQ switching in a fixed number of rounds;
`chord_q_limits` does the same with fixed matrices and a fixed count of matrix-vector iterations (no
factorisation, no data-dependent loop: the shape an accelerator runs well).
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
    pvpq: [n_pv + n_pq] int, pq: [n_pq] int  bus indices whose angle / magnitude are unknowns: pvpq lists the
      PV buses, then pq's
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


CHORD_Q_ITERS = 60      # chord_q_limits: iterations by default (the tso-caseN-ac tasks' count)
DERIVATIVE_ITERS = 30   # chord_q_limits: the last iterations, which carry the derivative
# chord_q_limits: Krylov (GMRES) or minimal-residual steps an iteration on the switched buses' block. One TPU v5e
# chip, tso-case118-ac, 16,384 envs: 8 GMRES steps 435k env-steps/s, 6 535k, 8 minimal-residual ones 615k; random
# set-points leave 279, 301 and 525 of 3,072 steps unsolved (2 CPU cores; full Newton 141)
Q_SWEEPS = 6
# chord_q_limits: the precision of the products with its fixed matrices (the correction; the residual, through
# the admittances, stays at full precision): a chord step's fixed point is where the residual vanishes, whatever
# matrix maps the residual to the step, so the matrix unit's one bfloat16 pass (where the full float32 product
# takes six) moves the iterations' path, not where they end
CORRECTION_PRECISION = jax.lax.Precision.DEFAULT
# _gmres_step: a new Krylov direction smaller than this share of its product is that product's rounding (one
# bfloat16 pass rounds to 2^-9), not a direction: the basis ends there
GMRES_BREAKDOWN = 1e-2


@struct.dataclass
class ChordQLimits:
    """The fixed matrices of `chord_q_limits`, from the power-flow Jacobian at one solved base point (host
    set-up, `make_chord_q_limits`). With a = the chord method's unknowns [Va(pvpq), Vm(pq)] and equations
    [P(pvpq), Q(pq)], b = the PV buses' |V| and Q:

    jinv: [m, m] J_aa^-1; coupling: [m, n] J_aa^-1 J_ab (how the unknowns follow a PV bus's |V|);
    q_rows: [n, m] H_ba (how the PV buses' Q follow the unknowns); schur: [n, n] the Schur complement
    S = H_bb - H_ba J_aa^-1 J_ab, dQ/d|V| of the PV buses with the equations held (n = n_pvpq; zero rows
    and columns at PQ entries)."""

    jinv: jnp.ndarray
    coupling: jnp.ndarray
    q_rows: jnp.ndarray
    schur: jnp.ndarray


def make_chord_q_limits(net: ACNetwork, v) -> ChordQLimits:
    """`ChordQLimits` at the solved voltage `v` (NumPy float64; the arrays in the default float dtype)."""
    full = net.replace(pq=net.pvpq)
    jf = np.asarray(jacobian(full, v), np.float64)   # d[P(pvpq); Q(pvpq)] / d[Va(pvpq); Vm(pvpq)]
    n = int(net.pvpq.shape[0])
    is_pv = ~np.isin(np.asarray(net.pvpq), np.asarray(net.pq))
    if np.any(np.diff(is_pv.astype(int)) > 0):
        raise ValueError("make_chord_q_limits: the network's pvpq must list its PV buses first, then pq's (as make_ac_network does)")
    a = np.concatenate([np.arange(n), n + np.flatnonzero(~is_pv)])   # in the chord method's order
    jinv = np.linalg.inv(jf[np.ix_(a, a)])
    b = n + np.flatnonzero(is_pv)                                      # the PV buses' |V| and Q
    coupling, q_rows, schur = np.zeros((a.size, n)), np.zeros((n, a.size)), np.zeros((n, n))
    coupling[:, is_pv] = jinv @ jf[np.ix_(a, b)]
    q_rows[is_pv] = jf[np.ix_(b, a)]
    schur[np.ix_(is_pv, is_pv)] = jf[np.ix_(b, b)] - q_rows[is_pv] @ coupling[:, is_pv]
    dtype = jnp.zeros(0).dtype
    return ChordQLimits(*(jnp.asarray(x, dtype) for x in (jinv, coupling, q_rows, schur)))


def chord_q_limits(net: ACNetwork, s_bus: jnp.ndarray, q_min: jnp.ndarray, q_max: jnp.ndarray, chord: ChordQLimits,
                   v0: jnp.ndarray | None = None, iters: int = CHORD_Q_ITERS, tol: float | None = None,
                   v_set: jnp.ndarray | None = None, derivative_iters: int = DERIVATIVE_ITERS):
    """`newton_raphson_q_limits` shaped for an accelerator: the same PV -> PQ switching and the same answer,
    with no factorisation per env and a fixed count of `iters` iterations (static; no data-dependent loop).

    Each iteration is a chord step of the block system with the switched buses' |V| as unknowns and their Q
    at the limit as equations, by elimination with `chord`'s fixed matrices: g = J_aa^-1 f, then
    S_ss d|V|_s = (Q_limit - Q + H_ba g)_s by Q_SWEEPS Krylov steps (`_gmres_step`; minimal-residual ones in
    the derivative iterations, `_mr_step`), then da = -g - J_aa^-1 J_ab d|V|.
    A switched bus's |V| moves until its Q sits at the limit: the fixed point is the PQ bus's solution.
    Switching as MATPOWER's runpf: once the iterate is solved (mismatch below `tol`), every PV bus whose Q
    is outside its limits switches, never back; the iterations go on from there. Four matrix-vector
    products an iteration, converging linearly: check `converged` (solved, and no PV bus outside its limits).

    Returns (v, converged, max_mismatch p.u., switched [n_bus] bool) as `newton_raphson_q_limits`. The
    derivative is that of the last `derivative_iters` iterations, which see the live inputs: it converges to
    the solution's (implicit) derivative as the iterate does to the solution (the chord method's one step in
    `newton_raphson` gives its fixed matrix's); fewer cost less forward-mode work per tangent. Their inner
    steps are the minimal-residual ones, whose derivative is linear in the tangent and iterates to the fixed
    point's (GMRES's, through its normalisations, did not behind the voltage schedule in float32)."""
    v0 = net.v0 if v0 is None else v0
    tol = default_tol(v0.real.dtype) if tol is None else tol
    n_bus, n, n_pv = v0.shape[0], net.pvpq.shape[0], net.pvpq.shape[0] - net.pq.shape[0]
    real = v0.real.dtype
    ref = jnp.ones(n_bus, bool).at[net.pvpq].set(False)
    pv = net.pvpq[:n_pv]   # pvpq lists the PV buses first (`ACNetwork`): the switching's entries are pvpq's first n_pv
    qlo, qhi = q_min[pv].astype(real), q_max[pv].astype(real)
    if v_set is not None:   # the reference and PV buses' |V| are v_set's; v0 is where the iterations start
        held0 = jnp.ones(n_bus, bool).at[net.pq].set(False)
        v0 = jnp.where(held0, jnp.abs(v_set) * jnp.exp(1j * jnp.angle(v0)), v0).astype(v0.dtype)
    v_live, s_live = v0, s_bus.astype(v0.dtype)
    # the PV buses' rows and columns of the matrices that act on their |V| and Q (the others' are zero)
    chord = chord.replace(coupling=chord.coupling[:, :n_pv], q_rows=chord.q_rows[:n_pv], schur=chord.schur[:n_pv, :n_pv])
    net_f, s_f, chord_f, v0 = jax.lax.stop_gradient((net, s_live, chord, v0))

    def system(net, chord, v):
        """What the iterations use, picked before the loop (so that the loop gathers and scatters nothing): Ybus's
        rows and columns of the non-reference buses (in pvpq order, where the PV and PQ buses are slices), the
        reference bus's fixed term Ybus[pvpq, ref] V_ref of those rows, `chord` and its Schur complement's diagonal."""
        rows = net.ybus[net.pvpq]
        return rows[:, net.pvpq], rows @ jnp.where(ref, v, 0), chord, jnp.diagonal(chord.schur)

    def iterate(system, vm, va, s, limit, switched, step):
        """One chord iteration from the polar voltage (vm, va) of the pvpq buses: (new vm, new va, the residual
        there (mismatch, switched buses' Q off limit), the PV buses' Q there)."""
        y, y_ref, chord, pivot = system
        v = vm * jnp.exp(1j * va).astype(v0.dtype)
        s_inj = v * jnp.conj(y @ v + y_ref)
        mis = s_inj - s
        f = jnp.concatenate([mis.real, mis.imag[n_pv:]])
        q = s_inj.imag[:n_pv]
        q_off = jnp.where(switched, limit - q, 0.0)
        g = _correction(chord.jinv, f)
        dvm_pv = step(chord.schur, pivot, q_off + _correction(chord.q_rows, g), switched, tol)
        dx = -g - _correction(chord.coupling, dvm_pv)
        residual = jnp.maximum(jnp.max(jnp.abs(f)), jnp.max(jnp.abs(q_off), initial=0.0))   # (no PV bus: empty)
        return vm + jnp.concatenate([dvm_pv, dx[n:]]), va + dx[:n], residual, q

    def body(system, s, step):
        def one(_, carry):
            vm, va, limit, switched = carry
            vm_next, va_next, residual, q = iterate(system, vm, va, s, limit, switched, step)
            free = (residual < tol) & ~switched   # solved here: its violations switch from the next iteration
            over, under = free & (q > qhi), free & (q < qlo)
            return vm_next, va_next, jnp.where(over, qhi, jnp.where(under, qlo, limit)), switched | over | under
        return one

    def polar(v):
        return jnp.abs(v)[net.pvpq], jnp.angle(v)[net.pvpq]

    live = min(derivative_iters, iters)
    system_f, s_p = system(net_f, chord_f, v0), s_f[net.pvpq]
    carry = jax.lax.fori_loop(0, iters - live, body(system_f, s_p, _gmres_step), (*polar(v0), jnp.zeros(n_pv, real), jnp.zeros(n_pv, bool)))
    # the last iterations with the live inputs: their derivative is the fixed point's (the tangent iterates
    # to the implicit derivative as the values do to the solution); the held set-points enter through _held_from
    vm, va, limit, switched = carry
    held = ref.at[pv].set(~switched)   # reference and unswitched PV buses
    v = _held_from(v0.at[net.pvpq].set(vm * jnp.exp(1j * va).astype(v0.dtype)), v_live, held, ref)
    vm, va, limit, switched = jax.lax.fori_loop(0, live, body(system(net, chord, v), s_live[net.pvpq], _mr_step),
                                                (*polar(v), limit, switched))
    v = v.at[net.pvpq].set(vm * jnp.exp(1j * va).astype(v0.dtype))
    _, _, mismatch, q = iterate(system_f, *jax.lax.stop_gradient((vm, va)), s_p, limit, switched, _mr_step)
    within = ~jnp.any(~switched & ((q > qhi + 10 * tol) | (q < qlo - 10 * tol)))
    return v, (mismatch < tol) & within, mismatch, jnp.zeros(n_bus, bool).at[pv].set(switched)


def _mr_step(schur, pivot, r, switched, tol):
    """d|V| of the switched PV buses from S_ss d|V| = r (`chord_q_limits`' derivative iterations): Q_SWEEPS
    minimal-residual steps (at most one per PV bus) preconditioned by S's diagonal `pivot` (each step lowers the
    residual, which Jacobi's need not where the buses are tightly coupled)."""
    gain = jnp.where(switched, 1.0 / jnp.where(switched, pivot, 1.0), 0.0)
    dvm = jnp.zeros_like(r)
    for _ in range(min(Q_SWEEPS, r.shape[0])):
        z = gain * r
        w = jnp.where(switched, _correction(schur, z), 0.0)
        # where the residual is far below the tolerance (solved, or no bus switched) a plain Jacobi step: the
        # quotient's derivative would divide by an underflowing ww^2, and the derivative (the tangent's own
        # iterations, which go on after the values have converged) needs a step linear in r
        ww = jnp.sum(w * w)
        mr = ww > (1e-3 * tol) ** 2
        alpha = jnp.where(mr, jnp.sum(r * w) / jnp.where(mr, ww, 1.0), 1.0)
        dvm, r = dvm + alpha * z, r - alpha * w
    return dvm


def _gmres_step(schur, pivot, r, switched, tol):
    """d|V| of the switched PV buses from S_ss d|V| = r (`chord_q_limits`): Q_SWEEPS steps of GMRES (at most one
    per PV bus), right-preconditioned by S's diagonal `pivot`: the residual's least-squares minimum over the
    Krylov space. Minimal-residual steps (one direction a step) stall where their step vanishes with the
    residual still there, and the iterations with them (the switched units' Q off their limits for good). Givens
    rotations keep the least squares in scalar arithmetic per env; far below the tolerance (solved, or no bus
    switched) one Jacobi step. A new direction below GMRES_BREAKDOWN of its product is taken for the product's
    rounding (the Krylov space holds the switched block already) and ends the basis there: on a TPU the products
    take one bfloat16 pass (`CORRECTION_PRECISION`), and that rounding, normalised into a direction, made steps
    of tso-case14-ac that the exact products solve diverge."""
    gain = jnp.where(switched, 1.0 / jnp.where(switched, pivot, 1.0), 0.0)
    k = min(Q_SWEEPS, r.shape[0])
    b = jnp.where(switched, r, 0.0)
    beta = jnp.sqrt(jnp.sum(b * b))
    solving = beta > 1e-3 * tol
    basis = [b / jnp.where(solving, beta, 1.0)]
    h = [[None] * k for _ in range(k + 1)]
    cos, sin, rhs = [], [], [beta] + [jnp.zeros_like(beta)] * k
    for j in range(k):
        w = jnp.where(switched, _correction(schur, gain * basis[j]), 0.0)
        size = jnp.sqrt(jnp.sum(w * w))
        for i in range(j + 1):   # modified Gram-Schmidt
            h[i][j] = jnp.sum(w * basis[i])
            w = w - h[i][j] * basis[i]
        new = jnp.sqrt(jnp.sum(w * w))
        h[j + 1][j] = jnp.where(new > GMRES_BREAKDOWN * size, new, 0.0)   # else the space is spanned: stop
        basis.append(jnp.where(h[j + 1][j] > 0, w / jnp.where(h[j + 1][j] > 0, h[j + 1][j], 1.0), 0.0))
        for i in range(j):   # the earlier rotations on the new column, then one that zeroes its last entry
            h[i][j], h[i + 1][j] = cos[i] * h[i][j] + sin[i] * h[i + 1][j], cos[i] * h[i + 1][j] - sin[i] * h[i][j]
        norm = jnp.sqrt(h[j][j] ** 2 + h[j + 1][j] ** 2)
        live = norm > 0
        cos.append(jnp.where(live, h[j][j] / jnp.where(live, norm, 1.0), 1.0))
        sin.append(jnp.where(live, h[j + 1][j] / jnp.where(live, norm, 1.0), 0.0))
        h[j][j] = norm
        rhs[j], rhs[j + 1] = cos[j] * rhs[j], -sin[j] * rhs[j]
    y = [None] * k   # back substitution on the rotated (triangular) least squares
    for j in reversed(range(k)):
        t = rhs[j] - sum(h[j][i] * y[i] for i in range(j + 1, k))
        y[j] = jnp.where(h[j][j] != 0, t / jnp.where(h[j][j] != 0, h[j][j], 1.0), 0.0)
    z = gain * sum(y[j] * basis[j] for j in range(k))
    return jnp.where(solving, z, gain * r)


def _correction(matrix, x):
    """A product of `chord_q_limits`' fixed matrices with the iterate's residual, at CORRECTION_PRECISION."""
    return jnp.matmul(matrix, x, precision=CORRECTION_PRECISION)


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
