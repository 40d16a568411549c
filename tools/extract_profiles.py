"""Extract the year of load, PV, wind and weather profiles that evogrid ships (evogrid/data/profiles_v1.npz).

Provenance tool, run by hand when the data version changes (needs the optional extra:
`pip install -e ".[data]"`, which brings simbench and pvlib; nothing else in evogrid imports them):

    python tools/extract_profiles.py evogrid/data/profiles_v1.npz

What it takes, all for the calendar year 2016 (366 days, 96 quarter-hours a day):
- SimBench (`simbench` package, complete data set, scenario 0, 1-complete_data-mixed-all-0-sw):
  the active-power columns of LoadProfile.csv listed in LOAD (standard and measured load profiles of
  households, commerce, industry and agriculture, and the aggregates an LV, MV or HV substation
  sees), relative to the element's rated power as SimBench gives them; PV1..PV8 and WP1..WP12 of
  RESProfile.csv (share of installed power). Unchanged except for the float16 cast.
- pvlib's TMY3 file 723170TYA.CSV (Greensboro, NC, USA; NREL TMY3, typical meteorological year):
  the dry-bulb temperature (degC) and the output of a PV array computed with pvlib's models (see
  `tmy_pv`). TMY hours are "hour ending": hour h's value covers the quarter-hours h-1:00..h-1:45.
  TMY has no 29 February; 2016's leap day repeats 28 February.
Stored float16 (relative error <= 4.9e-4) in a compressed npz: values [366, 96, n_series] per kind,
with the series names. The test suite re-runs `extract()` and compares it with the shipped file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VERSION = 1
YEAR_DAYS, DAY_STEPS = 366, 96  # 2016, quarter-hours
LOAD = {  # shipped name: SimBench LoadProfile column (p only)
    "household_a": "H0-A_pload", "household_b": "H0-B_pload", "household_c": "H0-C_pload",
    "commerce_general": "G0-A_pload", "commerce_office": "G1-A_pload", "commerce_shop": "G4-A_pload",
    "industry_continuous": "G3-A_pload", "industry_baseload": "BL-H_pload", "agriculture": "L0-A_pload",
    "lv_rural1": "lv_rural1_pload", "lv_rural2": "lv_rural2_pload", "lv_rural3": "lv_rural3_pload",
    "lv_semiurb4": "lv_semiurb4_pload", "lv_semiurb5": "lv_semiurb5_pload", "lv_urban6": "lv_urban6_pload",
    "mv_rural": "mv_rural_pload", "mv_semiurb": "mv_semiurb_pload", "mv_urban": "mv_urban_pload",
    "mv_comm": "mv_comm_pload",
    "hv_mixed1": "hv_mixed1_pload", "hv_mixed2": "hv_mixed2_pload", "hv_mixed3": "hv_mixed3_pload",
    "hv_urban": "hv_urban_pload",
}
PV = [f"PV{i}" for i in range(1, 9)]
WIND = [f"WP{i}" for i in range(1, 13)]
TMY_FILE = "723170TYA.CSV"
# The PV array on the TMY site: fixed, south-facing, tilted at 25 degrees; PVWatts DC model with
# gamma -0.4 %/K, SAPM cell temperature (open rack, glass/glass), 14 % system losses, output as a
# share of the DC rating (clipped to [0, 1]).
TILT, AZIMUTH, GAMMA_PDC, LOSSES = 25.0, 180.0, -0.004, 0.14


def _year_grid(values: np.ndarray) -> np.ndarray:
    """[35136, k] quarter-hour rows of 2016 -> [366, 96, k] float16."""
    if values.shape[0] != YEAR_DAYS * DAY_STEPS:
        raise ValueError(f"expected {YEAR_DAYS * DAY_STEPS} quarter-hours of 2016, got {values.shape[0]}")
    return values.reshape(YEAR_DAYS, DAY_STEPS, -1).astype(np.float16)


def simbench_profiles() -> dict[str, np.ndarray]:
    import pandas as pd
    import simbench

    folder = Path(simbench.complete_data_path(0))
    load = pd.read_csv(folder / "LoadProfile.csv", sep=";", usecols=["time", *LOAD.values()])
    res = pd.read_csv(folder / "RESProfile.csv", sep=";", usecols=["time", *PV, *WIND])
    for table in (load, res):
        first, last = table["time"].iloc[0], table["time"].iloc[-1]
        if (first, last) != ("01.01.2016 00:00", "31.12.2016 23:45"):
            raise ValueError(f"SimBench profiles span {first} .. {last}, expected the quarter-hours of 2016")
    return {"load": _year_grid(load[list(LOAD.values())].to_numpy(float)),
            "pv": _year_grid(res[PV].to_numpy(float)), "wind": _year_grid(res[WIND].to_numpy(float))}


def tmy_pv(data, meta) -> np.ndarray:
    """Hourly PV output (share of DC rating) from TMY irradiance with pvlib's models."""
    import pandas as pd
    import pvlib

    # TMY values are hour-ending averages: the sun's position at the middle of the hour.
    times = data.index - pd.Timedelta(minutes=30)
    sun = pvlib.solarposition.get_solarposition(times, meta["latitude"], meta["longitude"], meta["altitude"])
    with np.errstate(invalid="ignore", divide="ignore"):   # dni / dni_extra at night (both 0)
        poa = pvlib.irradiance.get_total_irradiance(
            TILT, AZIMUTH, sun["apparent_zenith"].to_numpy(), sun["azimuth"].to_numpy(), data["dni"].to_numpy(),
            data["ghi"].to_numpy(), data["dhi"].to_numpy(), dni_extra=data["dni_extra"].to_numpy(),
            model="haydavies")
    params = pvlib.temperature.TEMPERATURE_MODEL_PARAMETERS["sapm"]["open_rack_glass_glass"]
    poa_global = np.nan_to_num(np.asarray(poa["poa_global"], float))
    cell = pvlib.temperature.sapm_cell(poa_global, data["temp_air"].to_numpy(), data["wind_speed"].to_numpy(), **params)
    dc = pvlib.pvsystem.pvwatts_dc(poa_global, cell, 1.0, GAMMA_PDC)
    return np.clip(np.asarray(dc, float) * (1.0 - LOSSES), 0.0, 1.0)


def tmy_profiles() -> dict[str, np.ndarray]:
    import pvlib

    path = Path(pvlib.__file__).parent / "data" / TMY_FILE
    data, meta = pvlib.iotools.read_tmy3(str(path), coerce_year=2016, map_variables=True)
    if len(data) != 8760:
        raise ValueError(f"{TMY_FILE}: expected 8760 hours, got {len(data)}")
    hourly = np.stack([tmy_pv(data, meta), data["temp_air"].to_numpy(float)], axis=1).reshape(365, 24, 2)
    hourly = np.concatenate([hourly[:59], hourly[58:59], hourly[59:]])   # 29 Feb repeats 28 Feb (day 58)
    return {"tmy": np.repeat(hourly, 4, axis=1).astype(np.float16)}   # each hour over its four quarters


def extract() -> dict[str, np.ndarray]:
    """Every array of the data file (the same numbers each run)."""
    return {**simbench_profiles(), **tmy_profiles(), "version": np.array(VERSION),
            "load_names": np.array(list(LOAD)), "pv_names": np.array(PV), "wind_names": np.array(WIND),
            "tmy_names": np.array(["pv", "temp_air"])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    np.savez_compressed(out, **extract())
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
