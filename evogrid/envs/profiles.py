"""The days a task plays: seeded synthetic time series (built once in NumPy at set-up), or the shipped year of
real profiles (`evogrid.data`), and the day checks every task's `make_*_params` shares."""
from __future__ import annotations

import numpy as np

SPLITS = ("all", "train", "val", "test", "train+val")
PROFILES = ("synthetic", "real")
SYNTHETIC_DAYS = 64
# relative error of a load / PV forecast one 30-min interval ahead, growing with sqrt(lead): 1% at 30 min,
# 2% at 2 h, 2.8% at 4 h: system load forecasts commonly reach 1-3% MAPE day-ahead and less hours ahead
# (see the review of Hong & Fan, "Probabilistic electric load forecasting: a tutorial review", IJF 2016),
# so this is at the pessimistic end for the short leads a dispatch looks ahead.
FORECAST_ERROR = 0.01


def source_days(profiles: str, n_days, split: str, seed: int = 0) -> tuple[int, np.ndarray]:
    """(number of source days, indices of the `split`'s days among them) for a task's `profiles`.

    "synthetic": `n_days` generated days (default 64) split by `split_days`; "real": the 366 days of
    2016 in `evogrid.data`, split by calendar (`evogrid.data.calendar_days`: one test and one
    validation week per season); `n_days` must then be left unset.
    """
    if profiles not in PROFILES:
        raise ValueError(f"profiles must be one of {', '.join(PROFILES)}, got {profiles!r}")
    if profiles == "real":
        from evogrid import data

        if n_days is not None:
            raise ValueError(f"n_days sets how many synthetic days to generate; profiles='real' plays the "
                             f"{data.YEAR_DAYS} calendar days of 2016 (leave n_days unset)")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        return data.YEAR_DAYS, data.calendar_days(split)
    n_days = SYNTHETIC_DAYS if n_days is None else n_days
    check_days(1, 1.0, n_days)
    return n_days, split_days(n_days, split, seed)


def split_days(n_days: int, split: str, seed: int = 0) -> np.ndarray:
    """Day indices of `split` among `n_days` generated days (sorted).

    The rule, the same for every task: a permutation of the days seeded by `seed`; its first
    max(1, n_days // 4) days are the test days, the next max(1, n_days // 8) the validation days,
    the rest the training days ("all": every day). With the default 64 days: 40 train, 8 validation,
    16 test. Workflows train on "train", choose the policy they report on "val" (or "train+val", both: the
    `select_on` config field), and evaluate on "test".
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "all":
        return np.arange(n_days)
    if split == "train+val":
        return np.sort(np.concatenate([split_days(n_days, "train", seed), split_days(n_days, "val", seed)]))
    n_test, n_val = max(1, n_days // 4), max(1, n_days // 8)
    if n_days - n_test - n_val < 1:
        raise ValueError(f"n_days {n_days} is too few to split into train / val / test days (need >= 3)")
    order = np.random.default_rng(seed + 7_777).permutation(n_days)
    parts = {"test": order[:n_test], "val": order[n_test:n_test + n_val], "train": order[n_test + n_val:]}
    return np.sort(parts[split])


def bus_load_days(profiles: str, mix: str, base_mw: np.ndarray, n_days, split: str, max_steps: int,
                  delta_t_hours: float, seed: int = 0) -> np.ndarray:
    """Per-bus load [days of the split, max_steps, n_bus] from `profiles` (see `source_days`): synthetic
    `daily_load_profiles` or the real `evogrid.data.bus_loads` of the `mix` ("transmission"/"feeder")."""
    n_source, days = source_days(profiles, n_days, split, seed)
    if profiles == "real":
        from evogrid import data

        return data.bus_loads(base_mw, mix, days, max_steps, delta_t_hours, seed)
    return daily_load_profiles(base_mw, n_source, max_steps, delta_t_hours, seed=seed)[days]


def pv_days(profiles: str, n_units: int, n_days, split: str, max_steps: int, delta_t_hours: float,
            seed: int = 0) -> np.ndarray:
    """PV availability [days of the split, max_steps, n_units], share of rating: synthetic
    `daily_pv_profiles` or, real, one of SimBench's PV1..PV8 per unit (`evogrid.data.unit_series`)."""
    n_source, days = source_days(profiles, n_days, split, seed)
    if profiles == "real":
        from evogrid import data

        return data.unit_series("pv", n_units, days, max_steps, delta_t_hours, seed)
    return daily_pv_profiles(n_units, n_source, max_steps, delta_t_hours, seed=seed)[days]


def price_days(profiles: str, n_days, split: str, max_steps: int, delta_t_hours: float, seed: int = 0,
               tariff=(40.0, 70.0, 130.0)) -> np.ndarray:
    """Time-of-use price [days of the split, max_steps] in $/MWh (`daily_price_profiles`, for either source)."""
    n_source, days = source_days(profiles, n_days, split, seed)
    return daily_price_profiles(n_source, max_steps, delta_t_hours, seed, tuple(tariff))[days]


def forecast_features(series: np.ndarray, profiles: str, n_days, split: str, steps: int, error: float = FORECAST_ERROR,
                      seed: int = 0) -> np.ndarray:
    """Noisy forecasts for the observation: [n_days, T + 1, steps * k] from `series` [n_days, T, k] (the
    split's days, in the units the task observes them).

    At step t the policy sees, for h = 1..steps, series[t + h] x (1 + error x sqrt(h) x z) with
    z ~ N(0, 1): the error grows with the lead time like a random walk (`error`: FORECAST_ERROR one step
    ahead by default). z is drawn per source day (seeded by `seed`), so a day's forecasts are the same in every
    split. Steps past the horizon repeat the last interval. `steps = 0`: no forecast (shape [.., 0]).
    """
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"forecast_steps must be an integer >= 0, got {steps!r}")
    if not np.isfinite(error) or error < 0:
        raise ValueError(f"forecast_error must be >= 0 (relative error one step ahead), got {error!r}")
    n, horizon, k = series.shape
    if steps > horizon:
        raise ValueError(f"forecast_steps {steps} is longer than the day ({horizon} steps); forecast at most {horizon}")
    if steps == 0:
        return np.zeros((n, horizon + 1, 0))
    n_source, days = source_days(profiles, n_days, split, seed)
    z = np.random.default_rng([seed, 4242]).standard_normal((n_source, horizon + 1, steps, k))[days]
    lead = np.arange(1, steps + 1)
    target = series[:, np.minimum(np.arange(horizon + 1)[:, None] + lead[None, :], horizon - 1)]  # [n, T + 1, steps, k]
    return (target * (1.0 + error * np.sqrt(lead)[None, None, :, None] * z)).reshape(n, horizon + 1, steps * k)


def check_days(max_steps, delta_t_hours, n_days) -> None:
    """Refuse a horizon, step length or day count that cannot make a task, naming the argument."""
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1 (steps per episode), got {max_steps!r}")
    if not isinstance(delta_t_hours, (int, float)) or not np.isfinite(delta_t_hours) or delta_t_hours <= 0:
        raise ValueError(f"delta_t_hours must be a positive number of hours, got {delta_t_hours!r}")
    if n_days is not None and (not isinstance(n_days, (int, np.integer)) or n_days < 1):
        raise ValueError(f"n_days must be an integer >= 1 (days of profiles), got {n_days!r}")


def daily_load_shape(n_steps: int, delta_t_hours: float, morning: float = 0.25) -> np.ndarray:
    """Double-peak daily shape (morning ~9 h, evening ~19 h), peak 1.0, trough about 0.6. [n_steps]
    `morning`: height of the morning bump (weekends have a smaller one)."""
    def shape(h):
        bump = lambda centre, width: np.exp(-0.5 * ((h - centre) / width) ** 2)  # noqa: E731
        return 0.6 + morning * bump(9.0, 2.0) + 0.4 * bump(19.0, 2.5)

    hours = (np.arange(n_steps) + 0.5) * delta_t_hours % 24.0
    return shape(hours) / np.max(shape(np.arange(0.0, 24.0, 0.25)))  # peak over the day on a 15-min grid


def daily_load_profiles(base_mw: np.ndarray, n_days: int, n_steps: int, delta_t_hours: float,
                        seed: int = 0, day_range=(0.85, 1.10), weekend: float = 0.9, bus_noise: float = 0.03) -> np.ndarray:
    """Per-bus load for `n_days` synthetic days: [n_days, n_steps, n_bus], same units as `base_mw`.

    Day d is a weekday when d % 7 < 5 (day 0 is a Monday). load = base * shape(t) * day_scale *
    (1 + bus_noise * N(0, 1)): weekdays have the double-peak shape, weekends a smaller morning
    peak and `weekend` times the level; day_scale is uniform in `day_range`, so the evening peak
    exceeds the case's Pd on some days. Never negative for non-negative base loads.
    """
    rng = np.random.default_rng(seed)
    weekday = (np.arange(n_days) % 7 < 5)[:, None]
    shape = np.where(weekday, daily_load_shape(n_steps, delta_t_hours)[None],
                     weekend * daily_load_shape(n_steps, delta_t_hours, morning=0.1)[None])
    day_scale = rng.uniform(*day_range, size=(n_days, 1, 1))
    noise = 1.0 + bus_noise * rng.standard_normal((n_days, n_steps, base_mw.shape[0]))
    return base_mw[None, None, :] * shape[:, :, None] * day_scale * np.clip(noise, 0.0, None)


def daily_pv_profiles(n_units: int, n_days: int, n_steps: int, delta_t_hours: float, seed: int = 0,
                      cloud_spread: float = 0.3) -> np.ndarray:
    """PV availability per unit as a share of rating, [n_days, n_steps, n_units] in [0, 1].

    A clear-sky bell between 6 h and 18 h (peak at noon) times a seeded daily
    cloudiness factor uniform in [1 - cloud_spread, 1] and a little per-step noise.
    """
    rng = np.random.default_rng(seed + 7919)
    hours = (np.arange(n_steps) + 0.5) * delta_t_hours % 24.0
    clear = np.clip(np.sin(np.pi * (hours - 6.0) / 12.0), 0.0, None)
    cloud = rng.uniform(1.0 - cloud_spread, 1.0, size=(n_days, 1, 1))
    noise = 1.0 + 0.05 * rng.standard_normal((n_days, n_steps, n_units))
    return np.clip(clear[None, :, None] * cloud * noise, 0.0, 1.0)


def time_features(max_steps: int, delta_t_hours: float) -> np.ndarray:
    """Observation features per step index 0..max_steps: [sin, cos of the time of day at the interval's
    midpoint, episode progress t / max_steps]. [max_steps + 1, 3]"""
    hours = (np.arange(max_steps + 1) + 0.5) * delta_t_hours
    phase = 2 * np.pi * hours / 24
    return np.stack([np.sin(phase), np.cos(phase), np.arange(max_steps + 1) / max_steps], axis=1)


def daily_price_profiles(n_days: int, n_steps: int, delta_t_hours: float, seed: int = 0,
                         tariff=(40.0, 70.0, 130.0), spread: float = 0.1) -> np.ndarray:
    """Time-of-use energy price in $/MWh, [n_days, n_steps].

    `tariff` = (off-peak 23-7 h, shoulder 7-17 h, peak 17-23 h) prices; each day is
    scaled by a seeded factor uniform in [1 - spread, 1 + spread] with 2% per-step noise.
    """
    rng = np.random.default_rng(seed + 104729)
    hours = (np.arange(n_steps) + 0.5) * delta_t_hours % 24.0
    off, shoulder, peak = tariff
    base = np.where((hours >= 17) & (hours < 23), peak, np.where((hours >= 7) & (hours < 17), shoulder, off))
    day = rng.uniform(1.0 - spread, 1.0 + spread, size=(n_days, 1))
    return base[None, :] * day * (1.0 + 0.02 * rng.standard_normal((n_days, n_steps)))
