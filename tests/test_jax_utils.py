"""jit_method keeps self static; PRNG helpers accept both key styles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evogrid.utils.jax_utils import jit_method, rng_split, tree_stop_gradient


class Scaler:
    def __init__(self, factor, clip):
        self.factor, self.clip = factor, clip
        self.traces = 0

    @jit_method()
    def apply(self, x):
        self.traces += 1
        y = x * self.factor
        if self.clip:  # Python control flow on static configuration is allowed
            y = jnp.clip(y, -1.0, 1.0)
        return y


def test_jit_method_self_static_and_compiled_once_per_instance():
    a, b = Scaler(3.0, clip=True), Scaler(3.0, clip=False)
    np.testing.assert_allclose(a.apply(jnp.array([0.5, -0.1])), [1.0, -0.3], rtol=1e-6)
    a.apply(jnp.array([0.2, 0.1]))
    assert a.traces == 1  # second call with new values reuses the compiled program
    np.testing.assert_allclose(b.apply(jnp.array([0.5, -0.1])), [1.5, -0.3], rtol=1e-6)
    assert b.traces == 1


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_rng_split_accepts_new_and_legacy_keys(make_key):
    k1, k2 = rng_split(make_key(0))
    assert not np.array_equal(jax.random.uniform(k1, (3,)), jax.random.uniform(k2, (3,)))
    assert rng_split(make_key(0), 5).shape[0] == 5


def test_tree_stop_gradient():
    g = jax.grad(lambda x: jnp.sum(tree_stop_gradient({"a": x})["a"] * x))(jnp.ones(3))
    np.testing.assert_array_equal(g, 1.0)  # only the un-stopped factor contributes


def test_largest_is_top_k_ties_and_infinities_included(monkeypatch):
    from evogrid.utils.jax_utils import largest

    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")   # the accelerator's passes (the CPU calls top_k)
    x = jnp.array([0.5, -jnp.inf, 2.0, 0.5, 2.0, -jnp.inf, -1.0])
    for k in range(1, x.shape[0] + 1):
        values, index = largest(x, k)
        want_v, want_i = jax.lax.top_k(x, k)
        assert jnp.array_equal(values, want_v) and jnp.array_equal(index, want_i), (k, index, want_i)
    batch = jax.random.normal(jax.random.key(0), (64, 9)).round(1)   # rounded: ties (top_k orders them as it likes)
    values, index = jax.vmap(lambda v: largest(v, 4))(batch)
    assert jnp.array_equal(values, jax.lax.top_k(batch, 4)[0])
    assert jnp.array_equal(jnp.take_along_axis(batch, index, 1), values)
    tie = values[:, 1:] == values[:, :-1]
    assert jnp.all(jnp.where(tie, index[:, 1:] > index[:, :-1], index[:, 1:] != index[:, :-1]))


def test_take_rows_is_indexing_on_every_backend(monkeypatch):
    from evogrid.utils.jax_utils import take_rows

    # float32 numbers of every exponent from 2^-100 to 2^100 and random fractions: the product of the bfloat16
    # parts must give each to the bit
    bits = jax.random.bits(jax.random.key(1), (7, 3, 2), jnp.uint32) & jnp.uint32(0x807FFFFF)
    exponent = jax.random.randint(jax.random.key(2), (7, 3, 2), 27, 227).astype(jnp.uint32) << 23
    table = jax.lax.bitcast_convert_type(bits | exponent, jnp.float32)
    idx = jnp.array([6, 0, 3, 3])
    want = table[idx]
    assert jnp.array_equal(take_rows(table, idx), want)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")   # the one-hot product, bit for bit
    assert jnp.array_equal(take_rows(table, idx), want)
    assert jnp.array_equal(take_rows(table, idx, per_env=True), want)   # the select and sum
    assert jnp.array_equal(take_rows(table[:, 0, 0], idx), want[:, 0, 0])   # a vector: its float32 product
    assert jnp.array_equal(take_rows(table[:, 0, 0] > 0, idx), want[:, 0, 0] > 0)
    with jax.enable_x64():   # float64: one product at full precision
        assert jnp.array_equal(take_rows(table.astype(jnp.float64) / 3, idx), want.astype(jnp.float64) / 3)


def test_small_solve_matches_numpy_with_and_without_pivoting():
    from evogrid.utils.jax_utils import small_solve

    rng = np.random.default_rng(0)
    swap = np.array([[0.0, 2.0, 1.0], [1.0, 0.0, 3.0], [4.0, 1.0, 0.0]])   # a zero pivot: needs the row swaps
    for a in (swap, rng.normal(size=(6, 6)), rng.normal(size=(1, 1))):
        b, rhs = rng.normal(size=a.shape[0]), rng.normal(size=(a.shape[0], 2))
        np.testing.assert_allclose(small_solve(jnp.asarray(a), jnp.asarray(b)), np.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(small_solve(jnp.asarray(a), jnp.asarray(rhs)), np.linalg.solve(a, rhs), rtol=1e-4, atol=1e-5)
    assert not np.all(np.isfinite(small_solve(jnp.asarray(swap), jnp.ones(3), pivot=False)))   # the zero pivot
    spd = rng.normal(size=(5, 9))
    spd = spd @ spd.T
    batch = jnp.asarray(rng.normal(size=(16, 5)))
    x = jax.vmap(lambda r: small_solve(jnp.asarray(spd), r, pivot=False))(batch)
    np.testing.assert_allclose(x, np.linalg.solve(spd, np.asarray(batch).T).T, rtol=1e-4, atol=1e-5)
