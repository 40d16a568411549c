"""What only an accelerator shows, guarded by its cause on the CPU: set-up arithmetic runs in float64 on the
host, never on the default device (a TPU has no float64 LU), and float64 asked where the device cannot run it
is refused in one line before anything is built."""
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from evogrid.physics._common import host_float64
from evogrid.utils.jaxprs import equations

ROOT = Path(__file__).resolve().parents[1]

# Two host devices, the second made JAX's default (standing in for an accelerator): every float64 region of
# every task's `make` must run on the first (the host), and the params come back float32 on the default.
SPY = textwrap.dedent("""
    import contextlib, jax
    jax.config.update("jax_default_device", jax.devices()[1])
    seen, real = [], jax.enable_x64

    @contextlib.contextmanager
    def spy(on=True):
        seen.append(jax.config.jax_default_device)
        with real(on):
            yield

    jax.enable_x64 = spy
    from evogrid.envs import make
    from evogrid.safety import shield
    for task in ("tso-case14-ac", "tso-case5-n1", "dso-case33bw", "ders-case141", "dcmg", "gencos-case5"):
        env, params = make(task)
        for leaf in jax.tree_util.tree_leaves(params):
            assert leaf.devices() == {jax.devices()[1]}, (task, leaf.devices())
            assert leaf.dtype.itemsize <= 4 or leaf.dtype.kind == "c" and leaf.dtype.itemsize == 8, (task, leaf.dtype)
        safe = shield(env, params, "auto")
        obs, state = jax.jit(safe.reset)(jax.random.key(0), params)
        assert obs.devices() == {jax.devices()[1]}
    assert seen and all(d == jax.local_devices(backend="cpu")[0] for d in seen), seen
    print("ok", len(seen))
""")


@pytest.mark.slow
def test_make_runs_float64_only_on_the_host():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok ")


def test_no_float64_outside_the_host_helper():
    """x64 is switched on in one place, `physics._common.host_float64`, which also puts the CPU first."""
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "evogrid").rglob("*.py")
            if "enable_x64(" in p.read_text() and p.name != "_common.py"]
    assert not hits, hits


def test_float64_on_a_tpu_is_refused_before_set_up(monkeypatch):
    from evogrid.envs import make

    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with jax.enable_x64(True), pytest.raises(ValueError, match=r"float64 was asked for .* unset JAX_ENABLE_X64"):
        make("tso-case5")
    make("tso-case5")   # float32 builds
    with host_float64():   # as the baselines build a task after training on the chip: float64 on the host CPU
        make("tso-case5")


def _primitives(jaxpr, names=("gather", "scatter", "top_k", "sort")):
    """The primitives `names` anywhere in a closed jaxpr, inner loops and branches included."""
    return [eqn.primitive.name for eqn in equations(jaxpr) if eqn.primitive.name in names]


@pytest.mark.parametrize("task", ["tso-case5", "tso-case118"])
def test_the_redispatch_picks_rows_without_gathers_or_sorts_on_an_accelerator(monkeypatch, task):
    """On a TPU gathers at traced indices (a picked line's row) and top_k's sort slowed the security redispatch
    (1.5-1.8x and a fifth more time: utils.jax_utils.take_rows, largest): traced for an accelerator it picks
    rows by one-hot products and max/argmax passes, scatters none, and moves every dispatch as the CPU's
    gathers do, to the bit (random actions in the morning, with the peak plan on tso-case5)."""
    from evogrid.envs import make
    from evogrid.safety import make_layer
    from evogrid.utils.jax_utils import batch_reset, split_key_for_envs

    env, params = make(task)
    layer = make_layer(env, params, "on")
    obs, state = batch_reset(env, split_key_for_envs(jax.random.key(0), 32), params)
    shape = (32, env.action_space(params).shape[0])
    for t in range(16):   # into the morning ramp: random dispatches there overload lines and out-run the ramps
        act = jax.random.uniform(jax.random.key(t), shape, minval=-1.0, maxval=1.0)
        obs, state, *_ = jax.vmap(env.step, (0, 0, 0, None))(split_key_for_envs(jax.random.key(99 + t), 32), state, act, params)
    run = lambda: jax.jit(jax.vmap(layer))(obs, act)  # noqa: E731   (a new trace each call)
    on_cpu = run()
    assert _primitives(jax.make_jaxpr(jax.vmap(layer))(obs, act).jaxpr, ("gather", "top_k"))   # the CPU's way
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert _primitives(jax.make_jaxpr(jax.vmap(layer))(obs, act).jaxpr) == []
    for cpu, chip in zip(on_cpu, run()):
        assert jax.numpy.array_equal(cpu, chip)
    assert float(jax.numpy.sum(on_cpu[1])) > 0.0   # the layer moved something


@pytest.mark.parametrize("task, gathers", [("tso-case14", 0), ("dso-case33bw", 1), ("dcmg", 3)])
def test_the_step_picks_its_rows_by_products_on_an_accelerator(monkeypatch, task, gathers):
    """The day's loads, the forecast, the time features and the day's start state are rows of tables picked at
    traced indices; on a TPU those gathers held three quarters of tso-case14's step (16,384 envs: 84M env-steps/s
    without them, 20M with). Traced for an accelerator the step, its auto-reset included, picks them by one-hot
    products (`take_rows`, `day_row`), the step's rows of several tables at once (`day_rows`), and gives the
    CPU's gathers' outputs to the bit, across a day's end. A table over `take_rows`' limits gathers there, once
    for all the tables picked together: dso-case33bw's step (loads P and Q and PV side by side, 3,072 rows of
    70), dcmg's step, its observation and its auto-reset's observation (18,432 rows)."""
    from evogrid.envs import make
    from evogrid.utils.jax_utils import batch_reset, split_key_for_envs

    env, params = make(task)
    _, state = batch_reset(env, split_key_for_envs(jax.random.key(0), 8), params)
    state = state.replace(time_step=state.time_step.at[:4].set(params.max_steps - 1))   # half of them end the day
    act = jax.random.uniform(jax.random.key(1), (8, env.action_space(params).shape[0]), minval=-1.0, maxval=1.0)
    keys = split_key_for_envs(jax.random.key(2), 8)
    step = jax.vmap(env.step, (0, 0, 0, None))
    run = lambda: jax.jit(step)(keys, state, act, params)  # noqa: E731   (a new trace each call)
    on_cpu = run()
    assert _primitives(jax.make_jaxpr(step)(keys, state, act, params).jaxpr, ("gather",))   # the CPU's way
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    jax.clear_caches()   # the step's inner jitted pieces were traced for the CPU
    assert len(_primitives(jax.make_jaxpr(step)(keys, state, act, params).jaxpr, ("gather",))) == gathers
    for cpu, chip in zip(jax.tree_util.tree_leaves(on_cpu), jax.tree_util.tree_leaves(run())):
        assert jax.numpy.array_equal(cpu, chip)
    assert bool(jax.numpy.all(on_cpu[4][:4])) and not bool(jax.numpy.any(on_cpu[4][4:]))   # done where the day ended


def test_a_rollout_runs_blocks_of_steps_on_an_accelerator(monkeypatch):
    """On a TPU a loop that stacks every step's outputs wrote each step's slice of the trajectory one row of
    the chip's eight-row tiles at a time (the observations were 62% of tso-case118's rollout): traced for an
    accelerator `scan_rollout` runs 8 steps an iteration of its loop, where they divide the episode and the
    step is small, and one on the CPU; one behind a safety layer, whose loops make the step large (blocks
    gained at most 1.10x there and multiplied the compile: tso-case14-ac behind its voltage schedule 30 s
    -> 180 s on the chip); `collect` (the training rollouts, whose time is in their updates) one on both."""
    from evogrid.envs import make
    from evogrid.rollout import collect, scan_rollout
    from evogrid.safety import shield

    env, params = make("tso-case5")
    shielded = shield(env, params, "auto")
    _, state = env.reset(jax.random.key(0), params)
    _, held = shielded.reset(jax.random.key(0), params)
    acts = jax.numpy.zeros((params.max_steps, env.action_space(params).shape[0]))

    def lengths():
        jax.clear_caches()
        play = jax.make_jaxpr(lambda s: scan_rollout(env, jax.random.key(1), s, params, acts))(state).jaxpr
        ten = jax.make_jaxpr(lambda s: scan_rollout(env, jax.random.key(1), s, params, acts[:10]))(state).jaxpr
        walk = jax.make_jaxpr(lambda s: collect(env, params, lambda k, o, a: (a, None), jax.random.key(1), s,
                                                env.reset(jax.random.key(0), params)[0], 48, inputs=acts))(state).jaxpr
        layered = jax.make_jaxpr(lambda s: scan_rollout(shielded, jax.random.key(1), s, params, acts))(held).jaxpr
        return [[e.params["length"] for e in j.eqns if e.primitive.name == "scan"] for j in (play, ten, walk, layered)]

    assert params.max_steps == 48 and lengths() == [[48], [10], [48], [48]]
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert lengths() == [[6], [10], [48], [48]]
