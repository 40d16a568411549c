"""What every gradient learner shares: the optimiser hyper-parameters and the optimiser built from them."""
from __future__ import annotations

import dataclasses

import optax

from evogrid.utils.config import Config, param


@dataclasses.dataclass(frozen=True)
class GradientHyperparams(Config):
    learning_rate: float = param(1e-3, "Adam step size", lo=0.0, lo_open=True, cli="--lr")
    gamma: float = param(0.99, "discount factor", lo=0.0, hi=1.0)
    max_grad_norm: float = param(0.5, "global gradient-norm clip", lo=0.0, lo_open=True)


def make_optimizer(hyper: GradientHyperparams):
    """Adam after a global-norm clip."""
    return optax.chain(optax.clip_by_global_norm(hyper.max_grad_norm), optax.adam(hyper.learning_rate))
