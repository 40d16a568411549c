"""NSGA-II (Deb, Pratap, Agarwal & Meyarivan 2002): a population kept by non-dominated rank and crowding
distance over several objectives, all minimised.

Each `tell` merges the current population with the children just evaluated and keeps the `pop_size` best
by (rank, then larger crowding distance). Ranks use Deb's constrained domination with `tol`: a member
whose summed violation is at most `tol` dominates every member that violates more; between two
violating members the smaller violation dominates; between two feasible ones Pareto dominance on the
objectives decides. Children come from binary tournaments on the same order, varied as in
`MAPElites` (Gaussian mutation of the first parent plus a step of std `line_sigma` along the line to
the second; iso+line, Vassiliades & Mouret 2018). Until the first `tell` every child varies the
initial mean. The `init / ask / tell / center` interface of the other strategies, with the children's
objectives [pop, K] and violations [pop] passed to `tell`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from evogrid.operators import iso_line_variation


@struct.dataclass
class Front:
    mean: jnp.ndarray         # [D] the parents before the first tell
    params: jnp.ndarray       # [N, D]
    objectives: jnp.ndarray   # [N, K] minimised (+inf before the first tell)
    violation: jnp.ndarray    # [N] summed cost channels (+inf before the first tell)
    rank: jnp.ndarray         # [N] int32, 0 = the non-dominated front
    crowding: jnp.ndarray     # [N] crowding distance within the member's front (+inf at its ends)


def dominates(objectives, violation, tol):
    """[M, M] bool: member i dominates member j (constrained domination, see the module)."""
    feasible = violation <= tol
    pareto = jnp.all(objectives[:, None] <= objectives[None], -1) & jnp.any(objectives[:, None] < objectives[None], -1)
    fi, fj = feasible[:, None], feasible[None]
    return jnp.where(fi & fj, pareto, jnp.where(fi, ~fj, ~fj & (violation[:, None] < violation[None])))


def nondominated_ranks(objectives, violation, tol):
    """[M] int32 front index of each member: 0 for the members nobody dominates, 1 once those are removed, ..."""
    dom = dominates(objectives, violation, tol)
    m = objectives.shape[0]

    def peel(carry):
        rank, remaining, r = carry
        front = remaining & ~jnp.any(dom & remaining[:, None], axis=0)
        return jnp.where(front, r, rank), remaining & ~front, r + 1

    rank, _, _ = jax.lax.while_loop(lambda c: jnp.any(c[1]), peel,
                                    (jnp.full((m,), m, jnp.int32), jnp.ones((m,), bool), jnp.int32(0)))
    return rank


def crowding_distance(objectives, rank):
    """[M] sum over objectives of the gap between a member's two neighbours in its front, over the front's
    span of that objective; +inf for a front's extreme members."""
    m, k = objectives.shape
    distance = jnp.zeros((m,), objectives.dtype)
    for i in range(k):
        o = objectives[:, i]
        order = jnp.lexsort((o, rank))
        r, s = rank[order], o[order]
        inner = jnp.concatenate([jnp.zeros(1, bool), r[1:] == r[:-1]]) & jnp.concatenate([r[:-1] == r[1:], jnp.zeros(1, bool)])
        span = (jax.ops.segment_max(o, rank, num_segments=m) - jax.ops.segment_min(o, rank, num_segments=m))[r]
        gap = (jnp.roll(s, -1) - jnp.roll(s, 1)) / jnp.maximum(span, jnp.finfo(o.dtype).tiny)
        distance = distance.at[order].add(jnp.where(inner, gap, jnp.inf))
    return distance


class NSGA2:
    def __init__(self, pop_size: int, sigma: float, n_objectives: int, line_sigma: float = 0.2, tol: float = 0.0):
        self.pop_size, self.n_objectives, self.tol = pop_size, n_objectives, tol
        self.sigma, self.line_sigma = sigma, line_sigma

    def init(self, key, mean) -> Front:
        n, dtype = self.pop_size, mean.dtype
        return Front(mean, jnp.broadcast_to(mean, (n, mean.shape[0])), jnp.full((n, self.n_objectives), jnp.inf, dtype),
                     jnp.full((n,), jnp.inf, dtype), jnp.full((n,), n, jnp.int32), jnp.zeros((n,), dtype))

    def _before(self, state: Front, i, j):
        """Whether member i comes before member j (lower rank, then larger crowding distance)."""
        return (state.rank[i] < state.rank[j]) | ((state.rank[i] == state.rank[j]) & (state.crowding[i] > state.crowding[j]))

    def ask(self, key, state: Front):
        k_pick, k_mut, k_line = jax.random.split(key, 3)
        pick = jax.random.randint(k_pick, (2, 2, self.pop_size), 0, self.pop_size)    # two tournaments of two
        parents = jnp.where(self._before(state, pick[:, 0], pick[:, 1]), pick[:, 0], pick[:, 1])
        started = jnp.any(jnp.isfinite(state.violation))
        a = jnp.where(started, state.params[parents[0]], state.mean)
        b = jnp.where(started, state.params[parents[1]], state.mean)
        return iso_line_variation(k_mut, k_line, a, b, self.sigma, self.line_sigma), state

    def tell(self, key, population, state: Front, objectives, violation) -> Front:
        bad = ~(jnp.all(jnp.isfinite(objectives), -1) & jnp.isfinite(violation))
        objectives = jnp.where(bad[:, None], jnp.inf, objectives).astype(state.objectives.dtype)
        violation = jnp.where(bad, jnp.inf, jnp.maximum(violation, 0.0)).astype(state.violation.dtype)
        params = jnp.concatenate([state.params, population])
        obj = jnp.concatenate([state.objectives, objectives])
        viol = jnp.concatenate([state.violation, violation])
        rank = nondominated_ranks(obj, viol, self.tol)
        keep = jnp.lexsort((-self._crowding(obj, rank), rank))[: self.pop_size]
        # the survivors keep their ranks (whole fronts survive above the cut, so does every member dominating
        # a survivor); their distances change where the cut thinned a front: the next tournaments' order
        obj, viol, rank = obj[keep], viol[keep], rank[keep]
        return Front(state.mean, params[keep], obj, viol, rank, self._crowding(obj, rank))

    @staticmethod
    def _crowding(objectives, rank):
        """Crowding distances; 0 for a member without finite objectives (unevaluated or diverged: infinite
        violation puts it in the last front, with only its like)."""
        finite = jnp.all(jnp.isfinite(objectives), -1)
        return jnp.where(finite, crowding_distance(jnp.where(finite[:, None], objectives, 0.0), rank), 0.0)

    def center(self, state: Front):
        """The front member best on the first objective (the feasible ones first); the mean before any tell."""
        score = jnp.where(state.rank == 0, state.objectives[:, 0], jnp.inf)
        return jnp.where(jnp.isfinite(score).any(), state.params[jnp.argmin(score)], state.mean)
