"""The shipped year of real profiles (evogrid.data): extraction, resampling, calendar splits, bus mixes,
forecasts, and every task family on real days."""
import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

from evogrid import data
from evogrid.envs import make
from evogrid.envs.profiles import forecast_features

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_profiles_match_a_fresh_extraction():
    pytest.importorskip("simbench")
    pytest.importorskip("pvlib")
    spec = importlib.util.spec_from_file_location("extract_profiles", ROOT / "tools" / "extract_profiles.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    fresh = tool.extract()
    shipped = data._year()
    assert set(fresh) == set(shipped)
    for key in fresh:
        np.testing.assert_array_equal(shipped[key], fresh[key], err_msg=key)
    assert shipped["load"].shape == (366, 96, 23) and np.all(np.isfinite(shipped["load"].astype(float)))
    assert data.DATA_FILE.stat().st_size < 4e6


def test_resampling_by_hand():
    quarter = data.load_profiles("load", days=[10], names=["hv_urban"]).values[0, :, 0]  # 96 raw values
    raw = data._year()["load"][10, :, data.series_names("load").index("hv_urban")].astype(float)
    np.testing.assert_array_equal(quarter, raw)
    hourly = data.load_profiles("load", days=[10], delta_t_hours=1.0, names=["hv_urban"]).values[0, :, 0]
    np.testing.assert_allclose(hourly[[0, 7, 23]], [raw[0:4].mean(), raw[28:32].mean(), raw[92:96].mean()], rtol=1e-12)
    half = data.load_profiles("load", days=[10], delta_t_hours=0.5, names=["hv_urban"]).values[0, :, 0]
    np.testing.assert_allclose(half[5], (raw[10] + raw[11]) / 2, rtol=1e-12)
    five = data.load_profiles("load", days=[10], delta_t_hours=1 / 12, names=["hv_urban"]).values[0, :, 0]
    np.testing.assert_allclose(five[:6], [raw[0]] * 3 + [raw[1]] * 3, rtol=1e-9)   # each quarter held
    # an episode past midnight runs into the next day; after 31 December comes 1 January
    long = data.load_profiles("load", days=[365], delta_t_hours=1.0, n_steps=26, names=["hv_urban"]).values[0, :, 0]
    jan1 = data._year()["load"][0, :8, data.series_names("load").index("hv_urban")].astype(float)
    np.testing.assert_allclose(long[24:], [jan1[:4].mean(), jan1[4:8].mean()], rtol=1e-12)
    # 3-hour steps keep the day's energy
    three = data.load_profiles("load", days=[10], delta_t_hours=3.0, names=["hv_urban"]).values[0, :, 0]
    np.testing.assert_allclose(three.sum() * 3.0, raw.sum() * 0.25, rtol=1e-12)


def test_calendar_split():
    parts = {s: data.calendar_days(s) for s in ("train", "val", "test")}
    assert [len(parts[s]) for s in ("train", "val", "test")] == [310, 28, 28]
    assert not set(parts["train"]) & set(parts["val"]) and not set(parts["train"]) & set(parts["test"])
    assert not set(parts["val"]) & set(parts["test"])
    np.testing.assert_array_equal(np.sort(np.concatenate(list(parts.values()))), np.arange(366))
    np.testing.assert_array_equal(data.calendar_days("train+val"), np.sort(np.concatenate([parts["train"], parts["val"]])))
    for split in ("val", "test"):
        dates, weekday, season = data.calendar(parts[split])
        assert set(season) == {"winter", "spring", "summer", "autumn"}
        assert np.all(weekday[::7] == 0) and np.all(np.diff(parts[split]).max() > 7)   # whole weeks from Mondays
    dates, weekday, season = data.calendar([0, 59, 182])
    assert [str(d) for d in dates] == ["2016-01-01", "2016-02-29", "2016-07-01"]
    assert list(weekday) == [4, 0, 4] and season == ("winter", "winter", "summer")
    week = data.load_profiles("pv", days="test")
    assert week.values.shape == (28, 96, 8) and len(week.season) == 28


def test_bus_loads_mix_and_scale():
    base = np.array([10.0, 0.0, 250.0])
    year = data.bus_loads(base, "transmission", np.arange(366), 48, 0.5, seed=3)
    np.testing.assert_allclose(year.max(axis=(0, 1)), 1.1 * base, rtol=1e-12)
    assert np.all(year[..., 1] == 0) and np.all(year >= 0)
    np.testing.assert_array_equal(data.bus_loads(base, "transmission", [5, 6], 48, 0.5, seed=3), year[[5, 6]])
    other = data.bus_loads(base, "transmission", np.arange(366), 48, 0.5, seed=4)
    assert not np.allclose(other[..., 0], year[..., 0])   # each seed its own mixes
    winter, summer = year[data.calendar_days("test")[:7]].sum(-1).max(), year[data.calendar_days("test")[14:21]].sum(-1).max()
    assert winter > summer   # the January test week peaks above the July one (a European load)


def test_forecasts():
    series = np.random.default_rng(0).uniform(0.5, 1.0, size=(64, 6, 2))[:, :, :]
    exact = forecast_features(series, "synthetic", 64, "all", steps=2, error=0.0)
    assert exact.shape == (64, 7, 4)
    np.testing.assert_array_equal(exact[:, 0, :2], series[:, 1])      # step 0 sees intervals 1 and 2
    np.testing.assert_array_equal(exact[:, 0, 2:], series[:, 2])
    np.testing.assert_array_equal(exact[:, 5, :2], series[:, 5])      # past the horizon: the last interval
    noisy = forecast_features(np.ones((64, 48, 1)), "synthetic", 64, "all", steps=16, error=0.05)
    spread = (noisy - 1.0).reshape(-1, 16).std(axis=0) / 0.05
    np.testing.assert_allclose(spread, np.sqrt(np.arange(1, 17)), rtol=0.1)   # the error grows like sqrt(lead)
    # a day's forecast is the same in every split it appears in
    full = forecast_features(np.ones((64, 48, 1)), "synthetic", 64, "all", steps=3, error=0.05)
    test = forecast_features(np.ones((16, 48, 1)), "synthetic", 64, "test", steps=3, error=0.05)
    from evogrid.envs.profiles import split_days

    np.testing.assert_array_equal(full[split_days(64, "test")], test)
    with pytest.raises(ValueError, match="forecast_steps"):
        forecast_features(series, "synthetic", 64, "all", steps=-1)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["tso-case14-real", "dso-case33bw-real", "ders-case141-real", "dcmg-real", "gencos-case5-real"])
def test_real_profiles_in_every_task(task):
    env, test = make(task, split="test", forecast_steps=3)
    train = make(task, split="train", forecast_steps=0)[1]   # (the tso tasks carry a forecast by default)
    assert env.num_days(test) == 28 and env.num_days(train) == 310
    obs, state = env.reset(jax.random.key(0), test)
    assert obs.shape == env.observation_space(test).shape
    assert env.observation_space(test).shape[0] == env.observation_space(train).shape[0] + 3 * (2 if task[:3] in ("dso", "der", "dcm") else 1)
    out = jax.jit(env.step)(jax.random.key(1), state, np.zeros(env.action_space(test).shape), test)
    assert np.isfinite(float(out[2])) and np.all(np.isfinite(np.asarray(out[0])))


def test_real_profiles_bad_input():
    with pytest.raises(ValueError, match="leave n_days unset"):
        make("tso-case14-real", n_days=10)
    with pytest.raises(ValueError, match="profiles must be one of synthetic, real"):
        make("tso-case14", profiles="measured")
    with pytest.raises(ValueError, match="unknown profile kind 'solar'"):
        data.load_profiles("solar")
    with pytest.raises(ValueError, match="no series 'H0-A'"):
        data.load_profiles("load", names=["H0-A"])
    with pytest.raises(ValueError, match=r"days must be indices of 2016 in \[0, 366\)"):
        data.load_profiles("load", days=[366])
    with pytest.raises(ValueError, match="unknown task 'dcmg-reel'"):
        make("dcmg-reel")


def test_forecast_suffix_on_task_names():
    env, params = make("dcmg-real-fc3", split="test")
    plain = make("dcmg-real", split="test")[1]
    assert env.observation_space(params).shape[0] == env.observation_space(plain).shape[0] + 3 * 2
    assert params.forecast.shape == (28, params.max_steps + 1, 6)
    for bad in ("dcmg-fc2-fc3", "dcmg-fcx", "dcmg-real-real"):
        with pytest.raises(ValueError, match="unknown task"):
            make(bad)


def test_a_forecast_task_shares_its_oracle_cache(tmp_path, monkeypatch):
    from evogrid import baselines

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    plain, fc = (make(name, split="test")[1] for name in ("dcmg-real", "dcmg-real-fc2"))
    assert baselines._cache_path("dcmg-real", "test", plain) == baselines._cache_path("dcmg-real-fc2", "test", fc)
    other = make("dcmg-real", split="test", pv_mw=0.3)[1]
    assert baselines._cache_path("dcmg-real", "test", plain) != baselines._cache_path("dcmg-real", "test", other)


def test_what_the_operator_played_behind_a_layer_is_keyed_by_the_layer(monkeypatch):
    """The operator's baselines and demonstrations played behind a safety layer are cached under the layer's
    tag: its name, settings and VERSION, which a change in what the layer decides bumps."""
    from evogrid import baselines
    from evogrid.safety import shield
    from evogrid.safety.layers import ScheduleLayer

    env, params = make("tso-case14-ac", split="test", n_days=4)
    tag = baselines._layer_tag(shield(env, params))
    assert tag.startswith("ScheduleLayer-") and baselines._layer_tag(env) == "raw"
    monkeypatch.setattr(ScheduleLayer, "VERSION", ScheduleLayer.VERSION + 1)
    assert baselines._layer_tag(shield(env, params)) != tag


def test_a_baseline_cache_serves_another_machine(tmp_path, monkeypatch):
    """The start-of-day states and observations are computed on the default device (a TPU rounds them
    otherwise than a CPU): the caches' keys leave them out. The set-up's products carry the host's round-off
    in their last bits (another CPU's BLAS and XLA leave others; entries zero in exact arithmetic come out
    as noise): the keys round every float leaf, so what one machine computed another finds. A change in the
    task's own data, a halving too, still makes another key. tso-case118-ac: its inverse Jacobian's small
    entries, each rounded to its own significant bits, made another key on the chip's machine."""
    from evogrid import baselines

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    params = make("tso-case118-ac", split="test", n_days=4)[1]
    rng = np.random.default_rng(0)

    def roundoff(x):   # a float leaf as another machine's float64 set-up would leave it, in its own dtype: every
        x = np.asarray(x)   # entry off by up to ~1e-15 of the leaf's largest (as a TPU machine's host left tso-case118-ac's)
        if not np.issubdtype(x.dtype, np.floating):
            return x
        wide = x.astype(np.float64)
        top = np.max(np.abs(wide[np.isfinite(wide)]), initial=0.0)
        wide = wide + rng.uniform(-4, 4, x.shape) * 2.0 ** -52 * top
        return np.where(np.isfinite(x), wide, x).astype(x.dtype)

    nudge = lambda x: x * (1.0 + 1e-7) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) else x  # noqa: E731
    elsewhere = jax.tree.map(roundoff, params)
    elsewhere = elsewhere.replace(init=jax.tree.map(nudge, elsewhere.init), init_obs=nudge(elsewhere.init_obs))
    changed = [a.tobytes() != np.asarray(b).tobytes() for a, b in zip(jax.tree.leaves(elsewhere), jax.tree.leaves(params))]
    assert sum(changed) > 10, sum(changed)   # the raw bits differ in many leaves
    for observed in (False, True):
        path = baselines._cache_path("tso-case118-ac", "test", params, observed)
        assert baselines._cache_path("tso-case118-ac", "test", elsewhere, observed) == path
        for other in (params.replace(load_p=params.load_p * (1.0 + 1e-3)), params.replace(load_p=params.load_p * 0.5)):
            assert baselines._cache_path("tso-case118-ac", "test", other, observed) != path
