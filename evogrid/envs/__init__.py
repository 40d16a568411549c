"""Environments (PowerZooJax contract): `Environment`, task envs, `make(name)`."""
from evogrid.envs.dcmg import DCMGParams, DCMGState, DCMicrogridEnv, make_dcmg_params
from evogrid.envs.ders import DEREnv, DERParams, DERState, make_der_params
from evogrid.envs.dist import DistGridEnv, DistParams, DistState, make_dist_params
from evogrid.envs.environment import Environment, EnvParams, EnvState
from evogrid.envs.market import (
    GenCoMarketEnv,
    MarketMARLEnv,
    MarketParams,
    MarketState,
    make_market_params,
)
from evogrid.envs.marl import GridMARLEnv
from evogrid.envs.registry import list_tasks, make
from evogrid.envs.spaces import Box
from evogrid.envs.trans import TransGridEnv, TransParams, TransState, make_trans_params
from evogrid.envs.wrappers import (
    LogWrapper,
    RewardWrapper,
    SafeRLWrapper,
    TrainingWrapper,
)

__all__ = [
    "Box", "GenCoMarketEnv", "MarketMARLEnv", "MarketParams", "MarketState", "make_market_params", "DCMicrogridEnv", "DCMGParams", "DCMGState", "make_dcmg_params", "DEREnv", "DERParams", "DERState", "make_der_params", "GridMARLEnv", "DistGridEnv", "DistParams", "DistState", "make_dist_params", "EnvParams", "EnvState", "Environment", "TransGridEnv", "TransParams", "TransState",
    "list_tasks", "make", "make_trans_params",
    "LogWrapper", "RewardWrapper", "SafeRLWrapper", "TrainingWrapper",
]
