"""RLWorkflow: gradient agents written with optax, one training iteration per compiled call.

* PPO (on-policy): Gaussian policy (MLP mean, log-std a learned state-independent parameter or a
  constant), GAE in which a time-limit truncation bootstraps from the true last observation while
  a termination does not, advantage normalisation, optional value clipping, `epochs` passes over
  `minibatches` shuffled minibatches inside `lax.scan`.
* TD3 (off-policy): replay buffer in JAX arrays in the state (`utils.replay`), twin critics, target
  policy smoothing, delayed actor and target updates; random actions until `warmup_steps`.

The envs are stepped with `step_no_reset` and reset here, so each transition keeps its true next
observation (needed for truncation) while the batch still auto-resets. Cost-aware training: with
`cost_budget` set, the agents learn from reward - lambda * summed costs, and the multiplier lambda
(in the state) follows dual ascent on the episode cost against the budget.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evogrid.envs import make
from evogrid.envs.wrappers import TrainingWrapper
from evogrid.networks import MLP
from evogrid.rollout import rollout
from evogrid.utils.jax_utils import strong_types, tree_where
from evogrid.utils.replay import ReplayBuffer
from evogrid.workflows.base import ConfigMixin, Workflow

RL_ALGORITHMS = ("ppo", "td3")


@dataclasses.dataclass(frozen=True)
class GradientConfig(ConfigMixin):
    """Fields shared by the gradient-based configs (RLConfig, ERLConfig); they come first in each."""

    cost_budget: float | None = None   # cost-aware training (Lagrangian); None = off
    lambda_lr: float = 0.05
    eval_episodes: int = 16
    seed: int = 0
    learning_rate: float = 1e-3     # measured on tso-case5: 1e-3 learns in ~150 PPO iterations, 3e-4 barely moves
    gamma: float = 0.99
    # TD3 replay and exploration (also the hybrids' learner)
    buffer_size: int = 100_000
    batch_size: int = 256
    warmup_steps: int = 2_000       # random actions / no updates until the buffer holds this many
    expl_noise: float = 0.1


@dataclasses.dataclass(frozen=True)
class RLConfig(GradientConfig):
    task: str = "tso-case5"
    algorithm: str = "ppo"
    num_envs: int = 16
    rollout_len: int = 48           # steps per env per iteration
    hidden: tuple[int, ...] = (64, 64)
    max_grad_norm: float = 0.5
    # PPO
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    epochs: int = 4
    minibatches: int = 4
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    value_clip: bool = False
    learn_log_std: bool = True
    init_log_std: float = -0.5
    # TD3
    updates_per_iter: int = 48
    tau: float = 0.005
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2

    def __post_init__(self):
        self._check(RL_ALGORITHMS, "RL ")
        for name in ("num_envs", "rollout_len", "epochs", "minibatches", "batch_size", "policy_delay", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.num_envs * self.rollout_len) % self.minibatches:
            raise ValueError(f"num_envs * rollout_len ({self.num_envs * self.rollout_len}) must divide into "
                             f"{self.minibatches} minibatches")
        if self.buffer_size < self.num_envs * self.rollout_len:
            raise ValueError("buffer_size must hold at least one iteration of transitions (num_envs * rollout_len)")




@struct.dataclass
class RLState:
    key: jnp.ndarray                # uint32 key data
    actor: Any
    critic: Any
    target_actor: Any               # TD3 (PPO keeps a copy it does not use)
    target_critic: Any
    log_std: jnp.ndarray            # PPO
    actor_opt: Any
    critic_opt: Any
    buffer: Any                     # TD3 ReplayBuffer (PPO: None)
    env_state: Any
    obs: jnp.ndarray                # [num_envs, obs_dim]
    ep_return: jnp.ndarray          # [num_envs] running episode return
    last_return: jnp.ndarray        # mean return of the latest finished episodes
    ep_cost: jnp.ndarray            # [num_envs] running summed costs
    last_cost: jnp.ndarray
    lam: jnp.ndarray                # Lagrange multiplier
    iteration: jnp.ndarray
    updates: jnp.ndarray


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """Generalised advantage estimation over a [T, ...] rollout.

    delta_t = r_t + gamma * V(s'_t) * (1 - terminated_t) - V(s_t), where s'_t is the true next
    observation (so a time-limit truncation bootstraps and a termination does not);
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1} (no credit across episode ends).
    Returns (advantages, returns = advantages + values).
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values

    def back(carry, x):
        delta, d = x
        adv = delta + gamma * lam * (1.0 - d) * carry
        return adv, adv

    _, adv = jax.lax.scan(back, jnp.zeros_like(deltas[0]), (deltas, done.astype(deltas.dtype)), reverse=True)
    return adv, adv + values


class _Critic:
    """Twin Q networks (TD3) or one value network (PPO) as a vmapped MLP over a leading axis."""

    def __init__(self, hidden, n: int):
        self.net, self.n = MLP(hidden, 1, "relu", squash=False), n

    def init(self, key, x):
        return jax.vmap(lambda k: self.net.init(k, x))(jax.random.split(key, self.n))

    def __call__(self, params, x):
        return jax.vmap(lambda p: self.net.apply(p, x)[..., 0])(params)  # [n, ...]


class RLWorkflow(Workflow):
    """PPO or TD3 on a task (`config.algorithm`)."""

    def __init__(self, config: RLConfig = RLConfig(), env=None, env_params=None):
        self.config = config
        if env is None:
            env, env_params = make(config.task)
        self.env, self.env_params = env, env_params
        self.obs_dim = env.observation_space(env_params).shape[0]
        self.act_dim = env.action_space(env_params).shape[0]
        self.n_costs = env.num_constraints(env_params)
        ppo = config.algorithm == "ppo"
        self.actor = MLP(config.hidden, self.act_dim, "tanh", squash=not ppo)
        self.critic = _Critic(config.hidden, 1 if ppo else 2)
        self.optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate))
        self.eval_env = TrainingWrapper(env, config.eval_episodes)

    def config_dict(self) -> dict:
        return self.config.to_dict()

    # --- environment interaction ------------------------------------------------------------
    def _env_step(self, key, env_state, action):
        """One step of every env: (transition fields, next env_state, next obs) with auto-reset here."""
        def one(k, s, a):
            k_step, k_reset = jax.random.split(k)
            next_obs, s2, reward, costs, done, _ = self.env.step_no_reset(k_step, s, a, self.env_params)
            truncated = done & (s2.time_step >= self.env_params.max_steps)
            obs_r, s_r = self.env.reset(k_reset, self.env_params)
            return (next_obs, reward, costs, done & ~truncated, done), tree_where(done, s_r, s2), jnp.where(done, obs_r, next_obs)

        return jax.vmap(one)(jax.random.split(key, self.config.num_envs), env_state, action)

    def _track(self, state, reward, costs, done):
        """Running episode returns/costs; the latest finished episodes' means."""
        ret, cost = state.ep_return + reward, state.ep_cost + costs.sum(-1)
        n = done.sum()
        last_ret = jnp.where(n > 0, jnp.sum(ret * done) / jnp.maximum(n, 1), state.last_return)
        last_cost = jnp.where(n > 0, jnp.sum(cost * done) / jnp.maximum(n, 1), state.last_cost)
        return state.replace(ep_return=jnp.where(done, 0.0, ret), ep_cost=jnp.where(done, 0.0, cost),
                             last_return=last_ret, last_cost=last_cost)

    def _learning_reward(self, state, reward, costs):
        return reward - state.lam * costs.sum(-1) if self.config.cost_budget is not None else reward

    def _update_lambda(self, state, mean_step_cost):
        if self.config.cost_budget is None:
            return state.lam
        episode_cost = mean_step_cost * self.env_params.max_steps
        return jnp.maximum(state.lam + self.config.lambda_lr * (episode_cost - self.config.cost_budget), 0.0)

    # --- workflow ----------------------------------------------------------------------------
    def init(self, key=None) -> RLState:
        cfg = self.config
        key = jax.random.key(cfg.seed) if key is None else key
        key, k_actor, k_critic, k_env = jax.random.split(key, 4)
        obs0 = jnp.zeros((self.obs_dim,))
        actor = self.actor.init(k_actor, obs0)
        critic_in = obs0 if cfg.algorithm == "ppo" else jnp.zeros((self.obs_dim + self.act_dim,))
        critic = self.critic.init(k_critic, critic_in)
        log_std = jnp.full((self.act_dim,), cfg.init_log_std)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(k_env, cfg.num_envs), self.env_params)
        buffer = None
        if cfg.algorithm == "td3":
            example = {"obs": obs0, "action": jnp.zeros(self.act_dim), "reward": jnp.zeros(()),
                       "costs": jnp.zeros(self.n_costs), "next_obs": obs0, "terminated": jnp.zeros(())}
            buffer = ReplayBuffer.create(cfg.buffer_size, example)
        zero = jnp.zeros(())
        state = RLState(
            key=jax.random.key_data(key), actor=actor, critic=critic, target_actor=actor, target_critic=critic,
            log_std=log_std, actor_opt=self.optimizer.init((actor, log_std)), critic_opt=self.optimizer.init(critic),
            buffer=buffer, env_state=env_state, obs=obs, ep_return=jnp.zeros(cfg.num_envs), last_return=zero,
            ep_cost=jnp.zeros(cfg.num_envs), last_cost=zero, lam=zero, iteration=jnp.zeros((), jnp.int32),
            updates=jnp.zeros((), jnp.int32))
        return strong_types(state)

    def _step(self, state: RLState):
        return self._ppo_iteration(state) if self.config.algorithm == "ppo" else self._td3_iteration(state)

    def _policy(self, state):
        return lambda obs: self.actor.apply(state.actor, obs)

    def _evaluate(self, state: RLState):
        """Deterministic policy (the mean action) over `eval_episodes` fresh episodes."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state.key), 7)
        metrics, _ = rollout(self.eval_env, self._policy(state), key, self.env_params.max_steps, self.env_params,
                             obs_moments=False)
        return {"return": metrics["episode_return"].mean(), "return_std": metrics["episode_return"].std(),
                "cost_channels": metrics["episode_cost"].mean(0)}

    # --- PPO ---------------------------------------------------------------------------------
    def _log_prob(self, mean, log_std, action):
        return jnp.sum(-0.5 * ((action - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi), -1)

    def _ppo_iteration(self, state: RLState):
        cfg = self.config
        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_epochs = jax.random.split(key, 3)

        def collect(carry, k):
            st = carry
            k_act, k_env = jax.random.split(k)
            mean = self.actor.apply(st.actor, st.obs)
            action = mean + jnp.exp(st.log_std) * jax.random.normal(k_act, mean.shape)
            (next_obs, reward, costs, terminated, done), env_state, obs = self._env_step(k_env, st.env_state, action)
            out = {"obs": st.obs, "action": action, "logp": self._log_prob(mean, st.log_std, action),
                   "reward": self._learning_reward(st, reward, costs), "costs": costs, "next_obs": next_obs,
                   "terminated": terminated.astype(reward.dtype), "done": done}
            st = self._track(st, reward, costs, done).replace(env_state=env_state, obs=obs)
            return st, out

        state, traj = jax.lax.scan(collect, state, jax.random.split(k_roll, cfg.rollout_len))
        values = self.critic(state.critic, traj["obs"])[0]
        next_values = self.critic(state.critic, traj["next_obs"])[0]
        adv, ret = gae(traj["reward"], values, next_values, traj["terminated"], traj["done"], cfg.gamma, cfg.gae_lambda)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = {"obs": flat(traj["obs"]), "action": flat(traj["action"]), "logp": flat(traj["logp"]),
                 "adv": flat(adv), "ret": flat(ret), "value": flat(values)}
        n = batch["adv"].shape[0]

        def loss_fn(params, mb):
            (actor, log_std), critic = params
            log_std = log_std if cfg.learn_log_std else jax.lax.stop_gradient(log_std)
            mean = self.actor.apply(actor, mb["obs"])
            logp = self._log_prob(mean, log_std, mb["action"])
            ratio = jnp.exp(logp - mb["logp"])
            a = (mb["adv"] - mb["adv"].mean()) / (mb["adv"].std() + 1e-8)
            pg = -jnp.mean(jnp.minimum(ratio * a, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * a))
            v = self.critic(critic, mb["obs"])[0]
            v_loss = (v - mb["ret"]) ** 2
            if cfg.value_clip:
                v_clip = mb["value"] + jnp.clip(v - mb["value"], -cfg.clip_eps, cfg.clip_eps)
                v_loss = jnp.maximum(v_loss, (v_clip - mb["ret"]) ** 2)
            entropy = jnp.sum(log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e))
            return pg + cfg.vf_coef * 0.5 * jnp.mean(v_loss) - cfg.ent_coef * entropy, (pg, jnp.mean(v_loss))

        def minibatch(carry, idx):
            actor_p, critic_p, a_opt, c_opt = carry
            mb = jax.tree_util.tree_map(lambda x: x[idx], batch)
            grads, (pg, vl) = jax.grad(loss_fn, has_aux=True)((actor_p, critic_p), mb)
            upd, a_opt = self.optimizer.update(grads[0], a_opt, actor_p)
            actor_p = optax.apply_updates(actor_p, upd)
            upd, c_opt = self.optimizer.update(grads[1], c_opt, critic_p)
            return (actor_p, optax.apply_updates(critic_p, upd), a_opt, c_opt), (pg, vl)

        def epoch(carry, k):
            perm = jax.random.permutation(k, n).reshape(cfg.minibatches, -1)
            return jax.lax.scan(minibatch, carry, perm)

        carry = ((state.actor, state.log_std), state.critic, state.actor_opt, state.critic_opt)
        ((actor, log_std), critic, a_opt, c_opt), (pg, vl) = jax.lax.scan(epoch, carry, jax.random.split(k_epochs, cfg.epochs))
        state = state.replace(key=jax.random.key_data(key), actor=actor, log_std=log_std, critic=critic, actor_opt=a_opt,
                              critic_opt=c_opt, lam=self._update_lambda(state, traj["costs"].sum(-1).mean()),
                              iteration=state.iteration + 1, updates=state.updates + cfg.epochs * cfg.minibatches)
        return state, self._metrics(state, traj["costs"], {"policy_loss": pg.mean(), "value_loss": vl.mean()})

    def _metrics(self, state, costs, extra):
        return {"return": state.last_return, "episode_cost": state.last_cost, "lambda": state.lam,
                "cost_channels": costs.mean((0, 1)) * self.env_params.max_steps,
                "env_steps": (state.iteration * self.config.num_envs * self.config.rollout_len).astype(jnp.float32), **extra}

    # --- TD3 ---------------------------------------------------------------------------------
    def _q(self, critic, obs, action):
        return self.critic(critic, jnp.concatenate([obs, action], -1))  # [2, ...]

    def td3_update(self, state: RLState, key, actor_loss_on=True):
        """One TD3 gradient step on a replay batch (critics always; actor and targets every policy_delay)."""
        cfg = self.config
        k_batch, k_noise = jax.random.split(key)
        b = state.buffer.sample(k_batch, cfg.batch_size)
        reward = self._learning_reward(state, b["reward"], b["costs"])
        noise = jnp.clip(cfg.policy_noise * jax.random.normal(k_noise, b["action"].shape), -cfg.noise_clip, cfg.noise_clip)
        next_a = jnp.clip(self.actor.apply(state.target_actor, b["next_obs"]) + noise, -1.0, 1.0)
        target = reward + cfg.gamma * (1.0 - b["terminated"]) * jnp.min(self._q(state.target_critic, b["next_obs"], next_a), 0)
        target = jax.lax.stop_gradient(target)

        def critic_loss(c):
            return jnp.mean((self._q(c, b["obs"], b["action"]) - target[None]) ** 2)

        c_loss, c_grad = jax.value_and_grad(critic_loss)(state.critic)
        upd, c_opt = self.optimizer.update(c_grad, state.critic_opt, state.critic)
        critic = optax.apply_updates(state.critic, upd)

        def actor_loss(params):
            actor, _ = params
            return -jnp.mean(self._q(critic, b["obs"], self.actor.apply(actor, b["obs"]))[0])

        a_loss, a_grad = jax.value_and_grad(actor_loss)((state.actor, state.log_std))
        upd, a_opt_new = self.optimizer.update(a_grad, state.actor_opt, (state.actor, state.log_std))
        actor_new, _ = optax.apply_updates((state.actor, state.log_std), upd)
        delayed = (state.updates % cfg.policy_delay == 0) & actor_loss_on
        soft = lambda t, s: jax.tree_util.tree_map(lambda a, b_: (1 - cfg.tau) * a + cfg.tau * b_, t, s)  # noqa: E731
        actor = tree_where(delayed, actor_new, state.actor)
        state = state.replace(
            critic=critic, critic_opt=c_opt, actor=actor, actor_opt=tree_where(delayed, a_opt_new, state.actor_opt),
            target_actor=tree_where(delayed, soft(state.target_actor, actor), state.target_actor),
            target_critic=tree_where(delayed, soft(state.target_critic, critic), state.target_critic),
            updates=state.updates + 1)
        return state, (c_loss, a_loss)

    def _td3_iteration(self, state: RLState):
        cfg = self.config
        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_upd = jax.random.split(key, 3)

        def collect(st, k):
            k_act, k_rand, k_env = jax.random.split(k, 3)
            greedy = self.actor.apply(st.actor, st.obs)
            explore = jnp.clip(greedy + cfg.expl_noise * jax.random.normal(k_act, greedy.shape), -1.0, 1.0)
            random = jax.random.uniform(k_rand, greedy.shape, minval=-1.0, maxval=1.0)
            action = jnp.where(st.buffer.size < cfg.warmup_steps, random, explore)
            (next_obs, reward, costs, terminated, done), env_state, obs = self._env_step(k_env, st.env_state, action)
            tr = {"obs": st.obs, "action": action, "reward": reward, "costs": costs, "next_obs": next_obs,
                  "terminated": terminated.astype(reward.dtype)}
            st = self._track(st, reward, costs, done).replace(env_state=env_state, obs=obs, buffer=st.buffer.add(tr))
            return st, costs

        state, costs = jax.lax.scan(collect, state, jax.random.split(k_roll, cfg.rollout_len))
        ready = state.buffer.size >= jnp.minimum(cfg.warmup_steps, cfg.buffer_size)

        def update(st, k):
            new, losses = self.td3_update(st, k)
            return tree_where(ready, new, st), losses

        state, (c_loss, a_loss) = jax.lax.scan(update, state, jax.random.split(k_upd, cfg.updates_per_iter))
        state = state.replace(key=jax.random.key_data(key), lam=self._update_lambda(state, costs.sum(-1).mean()),
                              iteration=state.iteration + 1)
        return state, self._metrics(state, costs, {"critic_loss": c_loss.mean(), "actor_loss": a_loss.mean()})
