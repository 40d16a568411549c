"""Radial AC power flow by backward/forward sweep (BIBC/BCBV form; J.-H. Teng, IEEE Trans. Power Delivery 18(3), 2003).

With the feeder oriented away from the substation (reference) bus, `down[k, j]`
is 1 when bus j lies downstream of branch k. One sweep is
  backward: I_branch = down @ I_bus            (I_bus = conj(S_load / V) + y_sh * V)
  forward:  V = V_root - down.T @ (z * I_branch)
which the sweeps compute as one product V = V_root - Z I_bus with Z = down.T diag(z) down
(precomputed), the branch currents once at the end.
Line charging enters as shunts (b/2 at each end); taps and phase shifters are
not part of the radial model and are refused. Sweeps repeat until their estimated voltage error
falls below a tolerance that follows the dtype (or a static maximum is reached), and the
result says whether they converged: a feeder loaded beyond its capability has no solution.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.case.matpower import BR_B, BR_R, BR_X, SHIFT, VG, Case
from evogrid.physics._common import as_float, branch_admittances, complex_dtype


@struct.dataclass
class RadialNetwork:
    """down: [n_branch, n_bus] downstream matrix; z: [n_branch] complex p.u. series impedance
    (oriented parent -> child; `parent`, `child` are bus indices); y_sh: [n_bus] complex shunts;
    v_root: complex root voltage; root: the substation bus index."""

    down: jnp.ndarray
    z: jnp.ndarray
    drop: tuple          # (Re Z, Im Z, Re Z + Im Z) of Z = down' diag(z) down [n_bus, n_bus]: V = V_root - Z I_bus
    y_sh: jnp.ndarray
    parent: jnp.ndarray
    child: jnp.ndarray
    v_root: jnp.ndarray
    root: int = struct.field(pytree_node=False, default=0)
    base_mva: float = struct.field(pytree_node=False, default=1.0)


def make_radial_network(case: Case) -> RadialNetwork:
    n, nb = case.n_bus, case.n_branch
    if nb != n - 1:
        raise ValueError(f"{case.name} is not radial: {nb} in-service branches for {n} buses (a radial feeder has n_bus - 1)")
    if np.any(case.tap != 1.0) or np.any(case.branch[:, SHIFT] != 0):
        raise ValueError(f"{case.name}: the radial sweep does not model taps or phase shifters; use the Newton-Raphson solver")
    root = case.ref_bus
    nbrs = [[] for _ in range(n)]
    for k, (f, t) in enumerate(zip(case.f_bus, case.t_bus)):
        nbrs[f].append((t, k))
        nbrs[t].append((f, k))
    parent, child, order = np.zeros(nb, np.int32), np.zeros(nb, np.int32), [root]
    up_branch = -np.ones(n, int)
    seen = {root}
    for bus in order:  # breadth-first from the root; `order` grows while we walk it
        for nb_bus, k in nbrs[bus]:
            if nb_bus not in seen:
                seen.add(nb_bus)
                order.append(nb_bus)
                parent[k], child[k], up_branch[nb_bus] = bus, nb_bus, k
    down = np.zeros((nb, n))
    for bus in order[1:]:
        k = up_branch[bus]
        while k >= 0:  # every branch on the path from the root to `bus`
            down[k, bus] = 1.0
            k = up_branch[parent[k]]
    y_sh = branch_admittances(case)[-1].copy()
    np.add.at(y_sh, case.f_bus, 0.5j * case.branch[:, BR_B])
    np.add.at(y_sh, case.t_bus, 0.5j * case.branch[:, BR_B])
    vg = case.gen[case.gen_bus == root, VG][::-1]  # several units at the root: the last one's set-point (MATPOWER)
    cx = lambda a: jnp.asarray(a, dtype=complex_dtype())  # noqa: E731
    z = case.branch[:, BR_R] + 1j * case.branch[:, BR_X]
    zbus = down.T @ (z[:, None] * down)
    return RadialNetwork(
        down=as_float(down),
        z=cx(z),
        drop=(as_float(zbus.real), as_float(zbus.imag), as_float(zbus.real + zbus.imag)),
        y_sh=cx(y_sh),
        parent=jnp.asarray(parent),
        child=jnp.asarray(child),
        v_root=cx(vg[0] if vg.size else 1.0),
        root=root,
        base_mva=case.base_mva,
    )


def default_sweep_tol(dtype) -> float:
    """Estimated voltage error (p.u.) that counts as converged: 1e-10 in float64, 2e-7 in float32 (its
    round-off on a 1 p.u. voltage is 6e-8); the measured error stays below 1e-6 p.u. in float32."""
    return 1e-10 if jnp.finfo(dtype).bits == 64 else 2e-7


def _bus_current(net: RadialNetwork, s, v):
    """I_bus = conj(S / V) + y_sh V: the current each bus draws at voltages `v`."""
    return jnp.conj(s / v) + net.y_sh * v


def _sweep(net: RadialNetwork, s, v):
    """One backward/forward sweep from voltages `v`: V_root - Z I_bus(v), the complex product by Gauss's
    three real products (Re Z x_r, Im Z x_i, (Re Z + Im Z)(x_r + x_i)), 3/4 of the work of four."""
    x = _bus_current(net, s, v)
    zr, zi, zs = net.drop
    t1, t2, t3 = zr @ x.real, zi @ x.imag, zs @ (x.real + x.imag)
    return net.v_root - jax.lax.complex(t1 - t2, t3 - t1 - t2)


@jax.custom_jvp
def _solved(net: RadialNetwork, s, v):
    """`v`, the sweeps' fixed point v = g(net, s, v). It costs nothing in a rollout that is not
    differentiated; its derivative is the implicit one (below)."""
    return v


JVP_ROUNDS = 8  # fixed-point rounds of the derivative: the error shrinks like the sweeps' (rho ~ 0.1-0.3)


@_solved.defjvp
def _solved_jvp(primals, tangents):
    """dv = (I - dg/dv)^-1 dg/d(net, s) . (d_net, d_s), by the fixed-point rounds dv <- b + dg/dv dv
    (each one sweep's JVP; `JVP_ROUNDS` of them), not by a linear solve on the n_bus x n_bus system."""
    net, s, v = primals
    d_net, d_s, _ = tangents
    _, b = jax.jvp(lambda n, x: _sweep(n, x, v), (net, s), (d_net, d_s))
    dv = b
    for _ in range(JVP_ROUNDS):
        dv = b + jax.jvp(lambda w: _sweep(net, s, w), (v,), (dv,))[1]
    return v, dv


def backward_forward_sweep(net: RadialNetwork, s_load_pu: jnp.ndarray, v0: jnp.ndarray | None = None, iters: int = 30,
                           tol: float | None = None):
    """Bus voltages of a radial feeder.

    Args:
      s_load_pu: [n_bus] complex power drawn at each bus (load - distributed generation), p.u.
        The entry at the root is ignored (the substation supplies the balance).
      v0: [n_bus] complex starting voltages (default flat at the root voltage).
      iters: static maximum number of sweeps.
      tol: the voltage error to reach, default `default_sweep_tol` of the dtype.
    Returns:
      (v [n_bus] complex p.u., i_branch [n_branch] complex p.u. current parent -> child, converged bool)

    The sweeps (a `lax.while_loop` on constants) contract toward the solution, so after sweep k the
    error is about rho / (1 - rho) |V_k - V_k-1| with rho the contraction, estimated by the ratio of
    the last two changes; they stop once that estimate is below `tol` (`converged`), or after `iters`.
    Measured on case141 from a warm start, loads 0.3-1.7 x base: the estimate runs up to 2.6x low,
    hence the float32 default 2e-7, which keeps |V| within 4.4e-7 p.u. of a 1e-14 float64 solve (4-5
    sweeps). The derivative is the fixed point's (`_solved`).
    """
    n = net.down.shape[1]
    v0 = jnp.full((n,), net.v_root) if v0 is None else v0.astype(net.z.dtype)
    tol = default_sweep_tol(net.z.real.dtype) if tol is None else tol
    s = s_load_pu.astype(net.z.dtype)
    fixed_net, s_fixed, v_start = jax.lax.stop_gradient((net, s, v0))
    inf = jnp.asarray(jnp.inf, v_start.real.dtype)

    def keep_going(carry):
        i, _, _, error = carry
        return (i < iters) & (error >= tol)  # False once converged, or on NaN

    def body(carry):
        i, v, last_change, _ = carry
        v_new = _sweep(fixed_net, s_fixed, v)
        change = jnp.max(jnp.abs(v_new - v))
        rho = change / last_change
        # no bound before two sweeps, or while they do not contract
        error = jnp.where(jnp.isfinite(last_change) & (rho < 0.5), change * rho / (1 - rho), inf)
        return i + 1, v_new, change, error

    _, v, _, error = jax.lax.while_loop(keep_going, body, (jnp.int32(0), v_start, inf, inf))
    v = _solved(net, s, jax.lax.stop_gradient(v))
    # the branch currents of the final voltages, I_branch = down I_bus
    x = _bus_current(net, s, v)
    i_br = jax.lax.complex(net.down @ x.real, net.down @ x.imag)
    return v, i_br, error < tol
