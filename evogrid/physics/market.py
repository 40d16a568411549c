"""Market clearing: uniform-price merit order (copper plate) and DC optimal power flow with line limits.

Offers are segments k with a price c_k ($/MWh) and a capacity u_k (MW) at a bus. Both clearings
are pure functions of fixed shapes, so they jit and vmap.

Merit order: sort by price and fill the demand; the marginal segment sets the price.

DC-OPF (the linear programme an operator solves for nodal prices)

    min  c'g   s.t.  1'g = 1'd                         (balance, dual lambda)
                     -F <= PTDF (A g - d) + f0 <= F     (line limits, duals mu- , mu+ >= 0)
                     0 <= g <= u

is solved to optimality by a primal-dual interior-point method (Mehrotra predictor-corrector,
`box_lp`): the LP is tiny (one row per limited line), so 10-20 Newton steps on an m x m system
clear it exactly, where a first-order method needs thousands of iterations on a congested hour.
The nodal prices are  LMP_n = lambda - [PTDF' (mu+ - mu-)]_n. Variables are scaled internally (MW
by `base_mva`, prices by their largest magnitude). Accuracy against HiGHS is tested in
tests/test_market.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evogrid.physics._common import as_float
from evogrid.utils.jax_utils import largest, small_solve


def merit_order(prices, caps, demand):
    """Uniform-price clearing on a copper plate: (dispatch [K] MW, clearing price $/MWh, unserved MW).

    The price is the offer price of the marginal segment (the last one needed); when the offers
    cannot cover the demand, the last segment's price is returned and the shortfall as unserved.
    """
    order = jnp.argsort(prices)
    cap_sorted = caps[order]
    before = jnp.cumsum(cap_sorted) - cap_sorted
    take = jnp.clip(demand - before, 0.0, cap_sorted)
    dispatch = jnp.zeros_like(caps).at[order].set(take)
    marginal = jnp.clip(jnp.sum(before < demand) - 1, 0, caps.shape[0] - 1)
    unserved = jnp.maximum(demand - jnp.sum(caps), 0.0)
    return dispatch, prices[order][marginal], unserved


@struct.dataclass
class DCOPF:
    """Static structure of the DC-OPF for a fixed set of offer segments (see `make_dcopf`)."""

    seg_ptdf: jnp.ndarray   # [n_lim, K] flow on each limited line per MW from segment k
    ptdf: jnp.ndarray       # [n_lim, n_bus]
    f0: jnp.ndarray         # [n_lim]
    f_max: jnp.ndarray      # [n_lim] MW
    base: float = struct.field(pytree_node=False, default=100.0)


def make_dcopf(ptdf: np.ndarray, f0: np.ndarray, rate: np.ndarray, seg_bus: np.ndarray, base: float = 100.0) -> DCOPF:
    """`ptdf` [n_line, n_bus], `f0` [n_line] (flows at zero injection), `rate` [n_line] MW (0 or inf =
    unlimited; those lines are left out), `seg_bus` [K] bus index of each offer segment."""
    ptdf, rate = np.asarray(ptdf, float), np.asarray(rate, float)
    limited = np.isfinite(rate) & (rate > 0)
    return DCOPF(seg_ptdf=as_float(ptdf[limited][:, seg_bus]), ptdf=as_float(ptdf[limited]),
                 f0=as_float(np.asarray(f0)[limited]), f_max=as_float(rate[limited]), base=base)


def _newton(lp, point, rl, ru):
    """Newton direction of the box LP's KKT system at `point` = (z, w, y, s, v), w = u - z, toward
    complementarity z s -> z s + rl, w v -> w v + ru: the normal equations A D^-1 A' dy = r with
    D = s / z + v / w (m x m, m = rows, by an unrolled elimination, `small_solve`; a ridge, even of 100 eps per
    row, costs float32 its accuracy)."""
    c, a, b, _ = lp
    z, w, y, s, v = point
    d = s / z + v / w
    g = (c - a.T @ y - s + v) - rl / z + ru / w
    m = (a / d) @ a.T
    dy = small_solve(m, (b - a @ z) + a @ (g / d), pivot=False)
    dz = (a.T @ dy - g) / d
    return dz, dy, (rl - s * dz) / z, (ru + v * dz) / w


def _longest(x, dx):
    """Largest step in (0, 1] that keeps x + step dx >= 0."""
    return jnp.minimum(1.0, jnp.min(jnp.where(dx < 0, -x / jnp.where(dx < 0, dx, -1.0), jnp.inf)))


def _attainable(tol: float, dtype) -> float:
    """The residual tolerance that round-off in the normal equations allows: max(`tol`, 1000 eps)."""
    return max(tol, 1000 * float(jnp.finfo(dtype).eps))


def box_lp(c, a, b, u, iters: int = 50, tol: float = 1e-10):
    """min c'z  s.t.  A z = b, 0 <= z <= u  (u > 0) by Mehrotra's predictor-corrector interior-point
    method on the KKT conditions  A'y + s - v = c,  A z = b,  z s = mu,  w v = mu,  w = u - z,  s, v >= 0
    (w is carried, not recomputed, so a variable near its upper bound keeps its distance's digits).

    Starts at the box centre, stops when the duality gap relative to 1 + |c'z| is below `tol` and the
    primal and dual residuals relative to 1 + the size of b and c below max(`tol`, 1000 eps), when a step loses finiteness (the last
    finite point is kept), or after `iters` steps (a `lax.while_loop`; under vmap it runs until the
    slowest member stops). Returns (z, w, y, s, v); y are the rows' multipliers (d optimal cost / d b).
    """
    n = c.shape[0]
    lp = (c, a, b, u)
    res_tol = _attainable(tol, c.dtype)

    def body(carry):
        k, point, _ = carry
        z, w, y, s, v = point
        mu = (z @ s + w @ v) / (2 * n)
        dz, dy, ds, dv = _newton(lp, point, -z * s, -w * v)       # predictor (affine scaling)
        ap, ad = jnp.minimum(_longest(z, dz), _longest(w, -dz)), jnp.minimum(_longest(s, ds), _longest(v, dv))
        target = (((z + ap * dz) @ (s + ad * ds) + (w - ap * dz) @ (v + ad * dv)) / (2 * n * mu)) ** 3 * mu
        dz, dy, ds, dv = _newton(lp, point, target - z * s - dz * ds, target - w * v + dz * dv)  # corrector
        ap = 0.995 * jnp.minimum(_longest(z, dz), _longest(w, -dz))
        ad = 0.995 * jnp.minimum(_longest(s, ds), _longest(v, dv))
        new = (z + ap * dz, w - ap * dz, y + ad * dy, s + ad * ds, v + ad * dv)
        z, w, y, s, v = new
        residual = jnp.maximum(jnp.max(jnp.abs(a @ z - b)) / (1 + jnp.max(jnp.abs(b))),
                               jnp.max(jnp.abs(c - a.T @ y - s + v)) / (1 + jnp.max(jnp.abs(c))))
        # the duality gap bounds the cost error; the residuals cannot go below the round-off of the
        # normal equations (~1e-5 relative in float32), so they are held to max(tol, 1000 eps)
        error = jnp.maximum((z @ s + w @ v) / (1 + jnp.abs(c @ z)), residual * tol / res_tol)
        # past the attainable accuracy the normal equations lose their digits: keep the last finite point
        finite = jnp.all(jnp.isfinite(jnp.concatenate(new)))
        return k + 1, jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, point), jnp.where(finite, error, 0.0)

    def going(carry):
        k, _, error = carry
        return (k < iters) & (error > tol)

    start = (0.5 * u, 0.5 * u, jnp.zeros(b.shape, c.dtype), jnp.ones_like(c), jnp.ones_like(c))
    _, point, _ = jax.lax.while_loop(going, body, (jnp.int32(0), start, jnp.asarray(jnp.inf, c.dtype)))
    return point


PIVOTS = 1   # simplex pivots from the identified basis (`vertex`)


def vertex(lp, point, tol: float, pivots: int = PIVOTS):
    """The optimal vertex next to an interior-point solution (basis identification, a crossover step).

    Variables with the same column and cost (segments of one unit) are merged first: the interior
    point splits them evenly, a vertex fills them in any order. Of the merged variables the m farthest
    from their bounds form the basis B, the others sit at their nearer bound; x_B = B^-1 (b - N x_N),
    y = B^-T c_B. Then `pivots` steps of the bounded simplex: where a basic variable is out of its bounds, the
    dual simplex's (it leaves at the bound it crossed; the non-basic variable that keeps the reduced costs'
    signs enters), else the primal simplex's (the variable whose reduced cost most wants it off its bound
    enters; the first basic variable its move drives to a bound leaves, or it crosses to its other bound). A
    float32 interior point stops with residuals up to 1000 eps (~0.01-0.1 MW on case5), which can put a line
    or a unit with that much to spare at its limit: the basis read off the point then misses the optimum by
    one exchange and the prices jump (the chip's gencos-case5 disagreement; docs/accelerator.md). A merged
    value is shared in proportion to the members' bounds. B^-1 comes from one elimination and each pivot
    updates it (the product form), cheaper than solving again. The vertex replaces the point when it is
    primal and dual feasible to `tol` (relative): it is then optimal, exact to the round-off of one m x m
    inversion.
    Otherwise (a degenerate basis, a singular B) the point is kept. Returns (z, y, found).
    """
    c, a, b, u = lp
    z, w, y, _, _ = point
    m, n = a.shape
    same = (c[:, None] == c[None, :]) & jnp.all(a[:, :, None] == a[:, None, :], axis=0)
    leader = jnp.argmax(same, axis=1)                                   # first member of each group
    first = leader == jnp.arange(n)
    merge = lambda x: jnp.zeros_like(x).at[leader].add(x)  # noqa: E731
    zg, wg, ug = merge(z), merge(w), merge(u)
    column = first & jnp.any(a != 0, axis=0)                            # empty columns never enter
    _, basis = largest(jnp.where(column, jnp.minimum(zg, wg), -1.0), m)
    upper = first & (wg < zg)                                           # where a non-basic variable sits

    cols, slots = jnp.arange(n), jnp.arange(m)
    mv = lambda mat, vec: jnp.sum(mat * vec[None, :], axis=1)  # noqa: E731  (not a dot: see held_least_norm_step)

    def read(basis, upper, inv):
        """(in_basis, non-basic values, x_B, y, reduced costs) of a basis, its non-basic variables' bounds and B^-1."""
        in_basis = jnp.any(cols[:, None] == basis[None, :], axis=1)
        y_v = mv(inv.T, c[basis])
        x_n = jnp.where(~in_basis & upper, ug, 0.0)
        return in_basis, x_n, mv(inv, b - mv(a, x_n)), y_v, c - mv(a.T, y_v)

    inv = small_solve(a[:, basis], jnp.eye(m, dtype=a.dtype))          # B^-1, updated by each pivot
    for _ in range(pivots):
        in_basis, _, x_b, y_v, reduced = read(basis, upper, inv)
        free, ub = column & ~in_basis, ug[basis]
        # a basic variable out of its bounds: the dual simplex's pivot (it leaves at the bound it crossed)
        over = jnp.maximum(-x_b, x_b - ub) / (1 + ub)
        r_out = jnp.argmax(over)
        need = jnp.where(x_b[r_out] < 0, 1.0, -1.0)                     # its value must rise (or fall)
        alpha = mv(a.T, inv[r_out])                                     # row r_out of B^-1 A
        move = jnp.where(upper, -1.0, 1.0)                              # the way each non-basic variable can move
        eligible = free & (alpha * move * need < -tol)
        q_in = jnp.argmin(jnp.where(eligible, jnp.abs(reduced) / jnp.where(eligible, jnp.abs(alpha), 1.0), jnp.inf))
        dual_go = (over[r_out] > tol) & jnp.any(eligible)
        # else a non-basic variable whose reduced cost wants it off its bound: the primal simplex's pivot
        q = jnp.argmax(jnp.where(free, jnp.where(upper, reduced, -reduced), 0.0))
        gain = jnp.where(upper[q], reduced[q], -reduced[q])
        go = ~(over[r_out] > tol) & (gain > tol)                        # never with dual_go
        e = jnp.where(dual_go, q_in, q)                                 # the entering column
        w_e = mv(inv, a[:, e])                                          # B^-1 a_e
        rising = ~upper[q]                                              # the entering variable leaves 0 (or its bound)
        d = w_e * jnp.where(rising, 1.0, -1.0)                          # primal: x_B moves by -d a unit of q's move
        room = jnp.where(d > tol, jnp.maximum(x_b, 0.0) / jnp.where(d > tol, d, 1.0),
                         jnp.where(d < -tol, jnp.maximum(ub - x_b, 0.0) / jnp.where(d < -tol, -d, 1.0), jnp.inf))
        r = jnp.argmin(room)
        swap = room[r] < ug[q]                                          # a basic variable leaves, else q crosses
        upper = jnp.where(go & ~swap & (cols == q), rising, upper)
        upper = jnp.where(go & swap & (cols == basis[r]), d[r] < 0, upper)
        upper = jnp.where(dual_go & (cols == basis[r_out]), need < 0, upper)
        # the basis's change: slot p takes column e; B^-1 by the product form (its row p over the pivot w_p)
        change, p = go & swap | dual_go, jnp.where(dual_go, r_out, r)
        row = inv[p] / w_e[p]
        inv = jnp.where(change, jnp.where((slots == p)[:, None], row[None, :], inv - w_e[:, None] * row[None, :]), inv)
        basis = jnp.where(change & (slots == p), e, basis)

    in_basis, x, x_b, y_v, reduced = read(basis, upper, inv)
    x = jnp.where(in_basis, jnp.sum(jnp.where(cols[:, None] == basis[None, :], x_b[None, :], 0.0), axis=1), x)
    slack = tol * (1 + ug)
    primal = jnp.all((x >= -slack) & (x <= ug + slack))
    dual = jnp.all(in_basis | ~first | jnp.where(upper, reduced <= tol, reduced >= -tol))
    found = primal & dual & jnp.all(jnp.isfinite(x)) & jnp.all(jnp.isfinite(y_v))
    x = jnp.clip(x, 0.0, ug)[leader] * u / ug[leader]
    return jnp.where(found, x, z), jnp.where(found, y_v, y), found


@jax.custom_jvp
def _lp_solution(lp, point, z, y):
    """The solver's (z, y) for the box LP `lp`, reached at the interior point `point`: free in a rollout
    that is not differentiated; its derivative is that of one centred Newton step from `point` (below)."""
    return z, y


@_lp_solution.defjvp
def _lp_solution_jvp(primals, tangents):
    lp, point, z, y = primals
    d_lp = tangents[0]
    # the point held off the bounds by sqrt(eps), so that the step stays finite
    zc, wc, yc, sc, vc = point
    zc, wc, sc, vc = (jnp.maximum(x, jnp.sqrt(jnp.finfo(zc.dtype).eps)) for x in (zc, wc, sc, vc))
    mu = (zc @ sc + wc @ vc) / (2 * zc.shape[0])
    _, (dz, dy) = jax.jvp(lambda l: _newton(l, (zc, wc, yc, sc, vc), mu - zc * sc, mu - wc * vc)[:2], (lp,), (d_lp,))
    return (z, y), (dz, dy)


def dc_opf(opf: DCOPF, prices, caps, load_bus, iters: int = 50, tol=None):
    """Solve the DC-OPF. `prices`, `caps` [K]; `load_bus` [n_bus] MW. Returns (dispatch [K] MW,
    LMP [n_bus] $/MWh, line flows [n_lim] MW).

    With one bounded variable per limited line, t = flow + F in [0, 2F], the problem is the box LP
    min c'x  s.t.  1'x = 1'd,  PTDF_seg x - t = -F - flow(0),  0 <= x <= cap,  0 <= t <= 2F
    with 1 + n_lim rows, solved to optimality by `box_lp` (10-20 iterations, at most `iters`, until
    the relative residuals and duality gap are below `tol`: 1e-10 in float64, 1e-8 in float32, in units
    scaled by `base` MW and the largest price). LMP = lambda + PTDF' y_lines from the rows' multipliers.
    Segments of zero capacity are held at zero. The solve runs on constants; the derivatives are those of
    one centred Newton step from its point on the real inputs (`_lp_solution`: computed only when
    differentiating, the values stay the solver's). Make demand always coverable by offering load
    shedding as segments at a price cap.
    """
    dtype = prices.dtype
    scale_c = jnp.maximum(jnp.max(jnp.abs(prices)), 1.0)
    n_seg, n_lim = caps.shape[0], opf.f_max.shape[0]
    fmax = opf.f_max / opf.base
    base_flow = (opf.f0 - opf.ptdf @ load_bus) / opf.base            # flow with no generation, p.u.
    live = jnp.concatenate([caps > 0, jnp.ones(n_lim, bool)])
    a = jnp.block([[jnp.ones((1, n_seg), dtype), jnp.zeros((1, n_lim), dtype)],
                   [opf.seg_ptdf, -jnp.eye(n_lim, dtype=dtype)]]) * live
    b = jnp.concatenate([jnp.sum(load_bus)[None] / opf.base, -fmax - base_flow])
    c = jnp.concatenate([prices / scale_c, jnp.zeros(n_lim, dtype)])
    u = jnp.concatenate([jnp.where(caps > 0, caps / opf.base, 1.0), 2 * fmax])
    tol = (1e-10 if jnp.finfo(dtype).bits == 64 else 1e-8) if tol is None else tol
    lp = (c, a, b, u)
    point = jax.lax.stop_gradient(box_lp(*jax.lax.stop_gradient(lp), iters=iters, tol=tol))
    z, y, _ = jax.lax.stop_gradient(vertex(lp, point, _attainable(tol, dtype)))
    z, y = _lp_solution(lp, point, z, y)
    dispatch = z[:n_seg] * live[:n_seg] * opf.base
    lmp = scale_c * (y[0] + opf.ptdf.T @ y[1:])
    flows = opf.seg_ptdf @ dispatch + base_flow * opf.base
    return dispatch, lmp, flows
