"""A year of real profiles shipped with evogrid: load, PV, wind (SimBench) and weather (a TMY3 file via pvlib).

    from evogrid.data import load_profiles, calendar_days
    week = load_profiles("load", days=range(7), delta_t_hours=1.0)     # 1-7 January 2016, hourly
    week.values.shape, week.names[:3], week.dates[0], week.weekday[0], week.season[0]

The data (evogrid/data/profiles_v1.npz, ~2.3 MB; provenance and licences in PROVENANCE.md) covers the
366 days of 2016 at 15-minute resolution and loads with NumPy alone; `tools/extract_profiles.py` made
it from the `simbench` and `pvlib` packages. Kinds and their series (`series_names(kind)`):
- "load": SimBench active-power load profiles, relative to the element's rated power:
  standard/measured profiles of households, commerce, industry and agriculture, and the aggregates
  an LV, MV or HV substation sees (`lv_*`, `mv_*`, `hv_*`).
- "pv", "wind": SimBench PV1..PV8 and WP1..WP12, share of installed power.
- "tmy": a typical meteorological year (Greensboro, NC): "pv" (a fixed 25-degree south-facing array
  modelled with pvlib, share of DC rating) and "temp_air" (degC).

Resampling to a task's step (`delta_t_hours`): the 15-minute values are read as constant over their
quarter-hour and each step gets the mean over its interval, so energy is kept for any step length
(hourly steps average four values; 5-minute steps repeat a value three times). Day d's episode starts
at 00:00 of that day; an episode longer than a day runs on into the next (after 31 December, 1 January).

Calendar splits (`calendar_days`): test = the week (Monday to Sunday) from the second Monday of
January, April, July and October, validation = the same weeks of February, May, August and November
(one test and one validation week in every season), train = the other 310 days.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np

DATA_FILE = Path(__file__).with_name("profiles_v1.npz")
YEAR_START = np.datetime64("2016-01-01")
YEAR_DAYS, DAY_STEPS, STEP_HOURS = 366, 96, 0.25
KINDS = ("load", "pv", "wind", "tmy")
SEASONS = ("winter", "winter", "spring", "spring", "spring", "summer", "summer", "summer",
           "autumn", "autumn", "autumn", "winter")  # meteorological, by month
TEST_MONTHS, VAL_MONTHS = (1, 4, 7, 10), (2, 5, 8, 11)
# Load series each task mixes per bus (`bus_loads`): a transmission bus sees HV and MV substations'
# aggregates; a feeder bus an MV/LV substation's (with some commerce and industry).
MIXES = {
    # hv_mixed2 and hv_mixed3 are net loads that go negative (embedded generation): shipped, not mixed
    "transmission": ("hv_mixed1", "hv_urban", "mv_rural", "mv_semiurb", "mv_urban", "mv_comm"),
    "feeder": ("lv_rural1", "lv_rural2", "lv_rural3", "lv_semiurb4", "lv_semiurb5", "lv_urban6",
               "commerce_general", "industry_continuous"),
}


class Profiles(NamedTuple):
    values: np.ndarray    # [n_days, n_steps, n_series] float64
    names: tuple          # series names
    dates: np.ndarray     # [n_days] datetime64[D]: the date each episode starts
    weekday: np.ndarray   # [n_days] 0 = Monday
    season: tuple         # [n_days] "winter" / "spring" / "summer" / "autumn"


@functools.lru_cache(maxsize=1)
def _year() -> dict:
    if not DATA_FILE.exists():
        raise FileNotFoundError(f"{DATA_FILE} is missing: reinstall evogrid, or rebuild it with "
                                "`python tools/extract_profiles.py evogrid/data/profiles_v1.npz` (needs the [data] extra)")
    with np.load(DATA_FILE, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def series_names(kind: str) -> tuple:
    _check_kind(kind)
    return tuple(str(n) for n in _year()[f"{kind}_names"])


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"unknown profile kind {kind!r}; the shipped kinds are {', '.join(KINDS)}")


def calendar(days) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(dates, weekday with 0 = Monday, season) of day indices of 2016."""
    dates = YEAR_START + np.asarray(days, int).astype("timedelta64[D]")
    weekday = (np.asarray(days, int) + 4) % 7   # 1 January 2016 was a Friday
    months = dates.astype("datetime64[M]").astype(int) % 12
    return dates, weekday, tuple(SEASONS[m] for m in months)


def calendar_days(split: str = "all") -> np.ndarray:
    """Day indices (0 = 1 January 2016) of a calendar split: "train", "val", "test", "train+val" or "all" (sorted)."""
    if split not in ("all", "train", "val", "test", "train+val"):
        raise ValueError(f"split must be one of all, train, val, test, train+val, got {split!r}")
    if split == "train+val":
        return np.setdiff1d(np.arange(YEAR_DAYS), calendar_days("test"))
    every = np.arange(YEAR_DAYS)
    if split == "all":
        return every
    dates, weekday, _ = calendar(every)
    months = dates.astype("datetime64[M]").astype(int) % 12 + 1
    day_of_month = (dates - dates.astype("datetime64[M]")).astype(int) + 1

    def weeks(which):
        firsts = every[np.isin(months, which) & (weekday == 0) & (day_of_month >= 8) & (day_of_month <= 14)]
        return (firsts[:, None] + np.arange(7)).ravel()

    test, val = weeks(TEST_MONTHS), weeks(VAL_MONTHS)
    return {"test": np.sort(test), "val": np.sort(val), "train": np.setdiff1d(every, np.concatenate([test, val]))}[split]


def resample(year: np.ndarray, days, n_steps: int, delta_t_hours: float) -> np.ndarray:
    """Episodes of `n_steps` steps of `delta_t_hours` from quarter-hour data `year` [366, 96, k], each
    starting at 00:00 of a day in `days`: [n_days, n_steps, k], the mean of the data over each step."""
    flat = year.reshape(YEAR_DAYS * DAY_STEPS, -1).astype(np.float64)
    span_days = int(np.ceil(n_steps * delta_t_hours / 24.0)) + 1
    flat = np.concatenate([flat] + [flat] * span_days)[: (YEAR_DAYS + span_days) * DAY_STEPS]  # wrap into next year
    energy = np.concatenate([np.zeros((1, flat.shape[1])), np.cumsum(flat * STEP_HOURS, axis=0)])  # at quarter edges
    edges_h = 24.0 * np.asarray(days, int)[:, None] + delta_t_hours * np.arange(n_steps + 1)[None, :]
    at = np.stack([np.interp(edges_h.ravel() / STEP_HOURS, np.arange(energy.shape[0]), energy[:, j])
                   for j in range(energy.shape[1])], axis=-1).reshape(*edges_h.shape, -1)
    return np.diff(at, axis=1) / delta_t_hours


def load_profiles(kind: str, days=None, delta_t_hours: float = STEP_HOURS, n_steps: int | None = None,
                  names=None) -> Profiles:
    """Days of one kind of shipped series (all series, or those in `names`), resampled to `delta_t_hours`.

    `days`: day indices of 2016 (0 = 1 January; default every day) or a split name ("train", "val",
    "test", "all"; see `calendar_days`). `n_steps`: steps per episode (default one day's worth).
    """
    _check_kind(kind)
    if isinstance(days, str):
        days = calendar_days(days)
    days = np.arange(YEAR_DAYS) if days is None else np.asarray(days, int).reshape(-1)
    if days.size == 0 or np.any((days < 0) | (days >= YEAR_DAYS)):
        raise ValueError(f"days must be indices of 2016 in [0, {YEAR_DAYS}), got {days.tolist()[:8]}")
    if not np.isfinite(delta_t_hours) or delta_t_hours <= 0:
        raise ValueError(f"delta_t_hours must be a positive number of hours, got {delta_t_hours!r}")
    n_steps = int(round(24.0 / delta_t_hours)) if n_steps is None else n_steps
    available = series_names(kind)
    names = available if names is None else tuple(names)
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(f"{kind} profiles have no series {missing[0]!r}; they are: {', '.join(available)}")
    columns = [available.index(n) for n in names]
    values = resample(_year()[kind][..., columns], days, n_steps, delta_t_hours)
    return Profiles(values, names, *calendar(days))


def bus_loads(base_mw: np.ndarray, mix: str, days, n_steps: int, delta_t_hours: float, seed: int = 0,
              peak: float = 1.1) -> np.ndarray:
    """Per-bus load [n_days, n_steps, n_bus] (units of `base_mw`) from the real profiles of `MIXES[mix]`.

    Each bus draws its own mix of the series (Dirichlet(1) weights, seeded by `seed`) and is scaled so
    that its highest value over the whole year at this step length is `peak` x its base load (the
    case's Pd): winter evenings exceed Pd, summer days stay well below it. Buses with zero base stay zero.
    """
    if mix not in MIXES:
        raise ValueError(f"mix must be one of {', '.join(MIXES)}, got {mix!r}")
    base_mw = np.asarray(base_mw, float)
    weights = np.random.default_rng([seed, 2016]).dirichlet(np.ones(len(MIXES[mix])), size=base_mw.shape[0])
    year = load_profiles("load", None, delta_t_hours, n_steps, MIXES[mix]).values @ weights.T   # [366, T, n_bus]
    scale = peak * base_mw / np.maximum(year.max(axis=(0, 1)), 1e-9)
    return year[np.asarray(days, int)] * scale


def unit_series(kind: str, n_units: int, days, n_steps: int, delta_t_hours: float, seed: int = 0) -> np.ndarray:
    """[n_days, n_steps, n_units]: each unit one of the `kind` series ("pv" or "wind"), drawn with a seed
    (distinct series while there are enough)."""
    available = series_names(kind)
    rng = np.random.default_rng([seed, 7])
    pick = rng.permutation(len(available))[np.arange(n_units) % len(available)]
    return load_profiles(kind, days, delta_t_hours, n_steps, [available[i] for i in pick]).values
